"""Peak host memory of ``nvrm.serve.protocols.cosmos.latents.LatentDecoder.decode`` per VAE architecture and latent shape (CPU).

Each measurement runs in its own process: load the decoder, decode a tiny warm-up, reset the kernel's
peak-RSS counter (``/proc/self/clear_refs``), decode latents of the given shape, and report the peak RSS
above the resident size just before the decode, next to what ``LatentDecoder.peak_bytes`` reserves.

    python benchmarks/decoder_peak.py [--arch tiny|wan21 ...] [--shape T_LAT,h,w ...] [--out results/decoder_peak.json]

``tiny`` is the random VAE the tests build (base_dim 8, one res block); ``wan21`` is diffusers'
``AutoencoderKLWan()`` default config, the Wan2.1 VAE's architecture (random weights: memory does not
depend on them). Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHS = {
    "tiny": {"base_dim": 8, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1, "attn_scales": [], "temperal_downsample": [False, True, True]},
    "wan21": {},
}


def _status() -> dict[str, int]:
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) * 1024
    return out


def _child(folder: str, shape: tuple[int, int, int]) -> dict:
    import numpy as np

    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    dec = LatentDecoder(folder)
    dec.decode(np.zeros((1, 16, 1, 2, 2), np.float32))  # warm-up: kernels and thread pools exist before the measurement
    t, h, w = shape
    z = np.random.default_rng(0).standard_normal((1, 16, t, h, w)).astype(np.float16)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status()["VmRSS"]
    frames, seconds = dec.decode(z)
    peak = _status()["VmHWM"] - before
    return {"shape": [1, 16, t, h, w], "frames": list(frames.shape), "peak_bytes": peak,
            "reserved_bytes": dec.peak_bytes(z.shape) if hasattr(dec, "peak_bytes") else None, "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> None:
    """Measure each (architecture, shape) pair in a fresh process and print (and write) the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", choices=sorted(ARCHS))
    p.add_argument("--shape", action="append", help="T_LAT,h,w (latent frames, latent height, latent width)")
    p.add_argument("--out", type=Path)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(_child(a.child[0], tuple(int(x) for x in a.child[1].split(",")))))
        return
    import torch
    from diffusers import AutoencoderKLWan

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in a.arch or ["tiny"]:
            torch.manual_seed(0)
            folder = Path(tmp) / arch
            AutoencoderKLWan(**ARCHS[arch]).save_pretrained(str(folder))
            for shape in a.shape or ["1,8,12"]:
                got = subprocess.run([sys.executable, __file__, "--child", str(folder), shape], capture_output=True, text=True, check=True)
                row = {"arch": arch, **json.loads(got.stdout.strip().splitlines()[-1])}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.out:
        a.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
