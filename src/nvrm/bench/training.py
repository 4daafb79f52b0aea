"""``nvrm bench --workload train`` and ``train-step``: training measured side by side in one run.

``train`` (CPU or GPU, subprocesses):

- **scaling**: the same global batches trained by 1 and by 2 processes (``python -m nvrm train`` and
  ``torchrun``): pairs per second of the training phase, each process with its share of the cores;
- **memory**: peak resident memory of a training process as the pairs file grows ``factor`` times,
  with every video held in memory (``--cache-inputs``) against read from a store (``--store``);
- **store**: videos prepared per second into a store by 1 and by 2 preprocessing workers.

``train-step`` (in process, the model's own shapes: ``--arch 4b`` on a GPU): optimizer steps of
``batch`` pairs with gradient checkpointing on and off: pairs per second and peak device memory.

Pairs are the synthetic moving-square task (``nvrm prefs synth``) at the contract's sizes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_PEAK = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)
"""Runs a command and prints the peak resident memory (KiB) of it and every descendant it waited for."""


def _synth(folder: Path, examples: int, seed: int = 0) -> Path:
    from ..prefs.synthetic import write_task

    return Path(write_task(folder, examples, 0, seed=seed, variants=("freeze", "teleport"))["train"])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict[str, str]) -> tuple[int, float]:
    """(peak RSS in MiB of the command and its descendants, wall seconds)."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True, env=env, timeout=7200)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed:\n{proc.stderr[-3000:]}")
    return int(proc.stdout.strip().splitlines()[-1]) // 1024, wall


def _train(bundle: Path, pairs: Path, out: Path, procs: int, extra: list[str]) -> dict[str, Any]:
    args = ["-m", "nvrm", "train", "--base", str(bundle), "--pairs", str(pairs), "--output", str(out), "--json", "--epochs", "1",
            "--lora-rank", "8", "--warmup-steps", "0", "--save-every", "100000", *extra]
    threads = str(max(1, (os.cpu_count() or 1) // procs))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    bindir = Path(sys.executable).parent
    cmd = [sys.executable, *args] if procs == 1 else [str(bindir / "torchrun"), "--nproc-per-node", str(procs), "--master-port", str(_port()), *args]
    peak, wall = _run(cmd, env)
    summary = json.loads((out / "summary.json").read_text())
    return {"procs": procs, "peak_rss_mib": peak, "wall_s": wall, "train_s": summary["train_seconds"], "steps": summary["steps"]}


def run_train_bench(arch: str = "mid", examples: int = 8, factor: int = 10, batch_pairs: int = 4) -> dict[str, Any]:
    """The ``train`` workload's report (module docstring)."""
    from ..cli.main import main
    from .harness import build_bench_bundle

    bundle = build_bench_bundle(arch)
    with tempfile.TemporaryDirectory(prefix="nvrm-bench-train-") as tmp:
        root = Path(tmp)
        small = _synth(root / "small", examples)
        large = _synth(root / "large", examples * factor, seed=1)
        n_small = len(small.read_text().splitlines())
        n_large = len(large.read_text().splitlines())
        common = ["--batch-pairs", str(batch_pairs)]
        scaling = [_train(bundle, small, root / f"scale-{p}", p, common + ["--cache-inputs"]) for p in (1, 2)]
        for row in scaling:
            row["pairs_per_s"] = n_small / row["train_s"]
        memory = []
        for name, pairs, n in (("small", small, n_small), ("large", large, n_large)):
            for mode in ("memory", "store"):
                extra = common + (["--cache-inputs"] if mode == "memory" else ["--store", str(root / f"store-{name}")])
                row = _train(bundle, pairs, root / f"mem-{name}-{mode}", 1, extra)
                memory.append({"pairs": n, "mode": mode, "peak_rss_mib": row["peak_rss_mib"], "train_s": row["train_s"]})
        store = []
        for workers in (1, 2):
            target = root / f"build-{workers}"
            t = time.perf_counter()
            assert main(["prefs", "prepare", "--model", str(bundle), "--pairs", str(small), "--store", str(target), "--workers", str(workers)]) == 0
            seconds = time.perf_counter() - t
            from ..train.store import read_entries

            n_videos = len(read_entries(target))
            store.append({"workers": workers, "videos": n_videos, "seconds": seconds, "videos_per_s": n_videos / seconds,
                          "videos_per_s_per_worker": n_videos / seconds / workers})
    return {
        "workload": "train",
        "arch": arch,
        "cores": os.cpu_count(),
        "pairs": {"small": n_small, "large": n_large},
        "scaling": scaling,
        "speedup_2_vs_1": scaling[1]["pairs_per_s"] / scaling[0]["pairs_per_s"],
        "memory": memory,
        "store": store,
    }


def format_train(report: dict[str, Any]) -> str:
    lines = [f"training, {report['arch']} bundle, {report['cores']} cores", "", "processes  pairs/s  train s  peak RSS MiB (all processes)"]
    for r in report["scaling"]:
        lines.append(f"{r['procs']:>9}  {r['pairs_per_s']:>7.2f}  {r['train_s']:>7.1f}  {r['peak_rss_mib']:>12}")
    lines.append(f"2 processes vs 1: {report['speedup_2_vs_1']:.2f}x")
    lines += ["", "pairs  videos from  peak RSS MiB"]
    for r in report["memory"]:
        lines.append(f"{r['pairs']:>5}  {r['mode']:<11}  {r['peak_rss_mib']:>12}")
    lines += ["", "store build: workers  videos/s  per worker"]
    for r in report["store"]:
        lines.append(f"{r['workers']:>20}  {r['videos_per_s']:>8.2f}  {r['videos_per_s_per_worker']:>10.2f}")
    return "\n".join(lines)


def run_train_step(arch: str = "mid", batch_pairs: int = 4, steps: int = 3, device: str | None = None, size: tuple[int, int] = (432, 768)) -> dict[str, Any]:
    """The ``train-step`` workload: optimizer steps with gradient checkpointing on and off (one process)."""
    import torch

    from ..train import TrainConfig
    from ..train.trainer import Trainer
    from .harness import build_bench_bundle, device_name

    bundle = build_bench_bundle(arch)
    rows = []
    with tempfile.TemporaryDirectory(prefix="nvrm-bench-step-") as tmp:
        pairs_file = _step_pairs(Path(tmp) / "task", batch_pairs * steps, size)
        for ckpt in (True, False):
            cfg = TrainConfig(epochs=1, batch_pairs=batch_pairs, lora_rank=16, warmup_steps=0, save_every=10**6, gradient_checkpointing=ckpt, cache_inputs=True)
            t = Trainer(bundle, Path(tmp) / f"run-{ckpt}", cfg, device=device, log_stream=open(os.devnull, "w"))
            pairs = t.load_pairs(pairs_file, "training")
            dev = t.device
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                torch.cuda.reset_peak_memory_stats(dev)
            start = time.perf_counter()
            t.train(pairs)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            seconds = time.perf_counter() - start
            rows.append({"checkpointing": ckpt, "pairs_per_s": len(pairs) / seconds, "seconds": seconds,
                         "peak_device_mib": torch.cuda.max_memory_allocated(dev) // 2**20 if dev.type == "cuda" else None,
                         "tokens_per_sequence": int(max(p.chosen.num_tokens for p in t.feed.collect(t.feed.submit(list(enumerate(pairs[:1]))))))})
            del t
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return {"workload": "train-step", "arch": arch, "device": str(dev), "device_name": device_name(dev), "batch_pairs": batch_pairs, "steps": steps,
            "frames": {"height": size[0], "width": size[1]}, "rows": rows}


def _step_pairs(folder: Path, n: int, size: tuple[int, int]) -> Path:
    """n pairs at ``size``: a 10 s context and two 5 s candidates each (8 fps), as files."""
    import numpy as np

    from ..synth.clips import moving_square, write_video

    folder.mkdir(parents=True)
    rows = []
    for i in range(n):
        ctx = write_video(folder / f"c{i}.mp4", moving_square(80, *size, seed=3 * i), 8)
        a = write_video(folder / f"a{i}.mp4", moving_square(40, *size, seed=3 * i + 1), 8)
        b = write_video(folder / f"b{i}.mp4", np.repeat(moving_square(1, *size, seed=3 * i + 2), 40, axis=0), 8)
        rows.append({"prompt": "A square glides across a tiled floor.", "context": str(ctx), "chosen": str(a), "rejected": str(b)})
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def format_train_step(report: dict[str, Any]) -> str:
    lines = [f"training step, {report['arch']} on {report['device_name']}, {report['batch_pairs']} pairs per step", "",
             "checkpointing  pairs/s  peak device MiB  tokens/sequence"]
    for r in report["rows"]:
        peak = "-" if r["peak_device_mib"] is None else str(r["peak_device_mib"])
        lines.append(f"{'on' if r['checkpointing'] else 'off':>13}  {r['pairs_per_s']:>7.2f}  {peak:>15}  {r['tokens_per_sequence']:>15}")
    return "\n".join(lines)
