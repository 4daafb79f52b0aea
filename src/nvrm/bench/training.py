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
    from ..settings import LoadSettings
    from ..train import prepare_store
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
            prepare_store(str(bundle), [small], target, settings=LoadSettings(workers=workers))
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
            "frames": {"height": size[0], "width": size[1]}, "rows": rows, "computed_4b": train_cost_4b(pairs=batch_pairs)}


def train_cost_4b(pairs: int = 4, context_frames: int = 32, candidate_frames: int = 5, frame: tuple[int, int] = (224, 320), text_tokens: int = 125,
                  lora_rank: int = 16) -> dict[str, Any]:
    """Computed, not measured: matmul FLOP per pair and device memory per GPU for ``pairs`` pairs per step at the
    release's 4B shapes (``QWEN3_VL_4B_SPEC``), LoRA on the language model (the vision tower frozen), bf16.

    A sequence is ``context_frames + candidate_frames`` images of ``frame`` (height, width) pixels (224 x 320,
    the contract's size for 4:3 sources: 280 patches, 70 tokens each) plus ``text_tokens``: 2,715 tokens at
    the defaults. Per sequence, the vision tower runs forward only; the text layers run forward, once more
    to recompute (checkpointing) and backward for their inputs' gradients only (the frozen weights get
    none): about 3x a forward's matmuls. A pair is two sequences (chosen and rejected)."""
    from types import SimpleNamespace

    from ..synth.bundles import QWEN3_VL_4B_SPEC as s
    from .harness import forward_flops

    text = SimpleNamespace(hidden_size=s.hidden_size, num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads, head_dim=s.head_dim,
                           intermediate_size=s.intermediate_size, num_hidden_layers=s.num_layers)
    vision = SimpleNamespace(hidden_size=s.vision_hidden, spatial_merge_size=2, intermediate_size=s.vision_intermediate, out_hidden_size=s.hidden_size,
                             temporal_patch_size=2, patch_size=16, depth=s.vision_depth, deepstack_visual_indexes=s.deepstack_indexes)
    grid = (1, frame[0] // 16, frame[1] // 16)  # 14 x 20 patches at the defaults
    frames = context_frames + candidate_frames
    tokens = frames * (grid[1] * grid[2] // 4) + text_tokens
    vision_only = SimpleNamespace(text_config=SimpleNamespace(**{**vars(text), "num_hidden_layers": 0}), vision_config=vision)
    text_only = SimpleNamespace(text_config=text, vision_config=vision)
    vis = forward_flops(vision_only, [], [grid] * frames)
    lm = forward_flops(text_only, [(tokens, 0)], [])
    per_sequence = vis + 3 * lm
    gib = 2**30
    b = 2  # bytes per bf16 value
    weights = 8.8e9 / gib  # the release's 8.8 GB of bf16 weights
    lora = s.num_layers * 7 * lora_rank * (s.hidden_size + s.intermediate_size)  # q k v o gate up down, rank 16 (an upper bound)
    optimizer = lora * (4 + 4 + 4) / gib  # float32 master copy and the two Adam moments
    sequences = 2 * pairs
    saved = sequences * s.num_layers * tokens * s.hidden_size * b  # one checkpointed input per text layer
    one_layer = sequences * tokens * (s.hidden_size * 8 + s.intermediate_size * 3) * b  # the recomputed layer's activations
    vision_peak = frames * grid[1] * grid[2] * (s.vision_hidden * 6 + s.vision_intermediate * 3) * b  # one frame's worth per image, no graph
    return {
        "label": "computed",
        "pairs_per_step": pairs,
        "tokens_per_sequence": tokens,
        "flop_per_pair": 2 * per_sequence,
        "memory_gib_with_checkpointing": round(weights + optimizer + (saved + one_layer + vision_peak) / gib, 1),
        "memory_gib_without_checkpointing": round(weights + optimizer + (sequences * s.num_layers * tokens * (s.hidden_size * 8 + s.intermediate_size * 3) * b
                                                                          + vision_peak) / gib, 1),
        "h200_hours_per_312k_pairs_at_40pct_of_790_tflops": round(312_400 * 2 * per_sequence / (0.4 * 790e12) / 3600, 1),
    }


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
    c = report.get("computed_4b")
    if c:
        lines += ["", f"4B shapes, {c['pairs_per_step']} pairs per step, {c['tokens_per_sequence']} tokens per sequence (computed, not measured): "
                  f"{c['flop_per_pair']:.2e} FLOP per pair; {c['memory_gib_with_checkpointing']} GiB per GPU with checkpointing, "
                  f"{c['memory_gib_without_checkpointing']} GiB without; {c['h200_hours_per_312k_pairs_at_40pct_of_790_tflops']} H200-hours "
                  "for 312.4K pairs at 40 % of 790 TFLOP/s"]
    return "\n".join(lines)
