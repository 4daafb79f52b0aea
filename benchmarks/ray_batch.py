"""Rows/s of `nvrm batch` on this machine: single process vs Ray with 1 and 2 replicas.

    .venv/bin/python benchmarks/ray_batch.py [--rows 48]

Same manifest (single-candidate rows over 320x240 24 fps H.264 clips, tiny
random bundle), same output rows; Ray runs on a local cluster with
``num_cpus`` equal to the machine's cores, the single-process job uses the
same cores (torch threads + preprocessing pool). Ray's cluster start-up is
reported separately and not counted in its rows/s.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from nvrm import RewardModel
from nvrm.batch.ray_runner import run_batch_ray
from nvrm.batch import run_batch
from nvrm.synth.bundles import build_tiny_bundle
from nvrm.synth.clips import moving_square, write_video


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=48)
    args = ap.parse_args()
    import ray

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        bundle = build_tiny_bundle(d / "bundle")
        write_video(d / "ctx.mp4", moving_square(24 * 6, 240, 320, seed=1), 24)
        for i in range(4):
            write_video(d / f"c{i}.mp4", moving_square(24 * 6, 240, 320, seed=2 + i), 24)
        rows = [{"id": f"r{i}", "prompt": "p", "context": "ctx.mp4", "candidate": f"c{i % 4}.mp4"} for i in range(args.rows)]
        (d / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        model = RewardModel.from_pretrained(bundle, device="cpu")
        t = time.perf_counter()
        s = run_batch(model, d / "m.jsonl", d / "single.jsonl", progress=open(os.devnull, "w"))
        single = s.rows / (time.perf_counter() - t)
        t = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, object_store_memory=512 * 1024 * 1024)
        startup = time.perf_counter() - t
        results = {}
        for replicas in (1, 2):
            t = time.perf_counter()
            s = run_batch_ray(d / "m.jsonl", d / f"ray{replicas}.jsonl", bundle=str(bundle), replicas=replicas, progress=open(os.devnull, "w"))
            results[replicas] = s.rows / (time.perf_counter() - t)
        ray.shutdown()
    print(f"{args.rows} rows, {os.cpu_count()} CPUs; Ray local-cluster start-up {startup:.1f} s (not counted)")
    print("| mode | rows/s | vs single process |")
    print("|---|---:|---:|")
    print(f"| single process (`nvrm batch`) | {single:.2f} | 1.00x |")
    for r, v in results.items():
        print(f"| Ray, {r} replica(s) | {v:.2f} | {v / single:.2f}x |")


if __name__ == "__main__":
    main()
