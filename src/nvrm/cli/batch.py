"""``nvrm batch``: a manifest of clips scored into a resumable JSONL / CSV / Parquet file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from .model_flags import add_model_args
from .options import add_ray_args


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm batch``: model loading, the run (generated from ``BatchSettings``), and the Ray options."""
    from ..batch.runner import BatchSettings
    from .options import add_dataclass_args

    add_model_args(p)
    add_dataclass_args(p, BatchSettings, group="batch")
    ray = add_ray_args(p, what="scale past one process or machine", replica="a Ray Data pipeline with an actor pool of scorers")
    ray.add_argument("--cpus-per-preprocess", type=float, default=1.0, help="CPUs per preprocessing task")


def run_batch(args: argparse.Namespace) -> int:
    """``nvrm batch``: score a manifest into a durable, resumable output (locally or on Ray). Returns 0, or 1
    when some rows failed for internal reasons (out of memory, a crash) rather than their input."""
    from ..batch import LocalExecutor, run
    from ..batch.manifest import read_manifest
    from ..batch.sink import output_format
    from .model_flags import settings_from_args

    from ..batch.runner import BatchSettings
    from .options import dataclass_from_args

    batch = dataclass_from_args(args, BatchSettings)
    output_format(Path(batch.output))  # refuse an unknown extension before loading the model
    read_manifest(batch.input)  # and a manifest that cannot be read
    settings = settings_from_args(args)
    common = dict(resume=batch.resume, overwrite=batch.overwrite, flush_every=batch.flush_every)
    if args.ray:
        from ..batch.ray_runner import RayExecutor
        from ..cluster.ray_tasks import require_ray

        if args.replicas < 1:
            raise InputError(f"--replicas {args.replicas}", "must be at least 1")
        require_ray()
        executor = RayExecutor(
            args.model,
            settings=settings,
            address=args.ray_address,
            replicas=args.replicas,
            gpus_per_replica=args.gpus_per_replica,
            cpus_per_preprocess=args.cpus_per_preprocess,
        )
        summary = run(batch.input, batch.output, executor, **common)
        print(f"nvrm batch (ray, {args.replicas} replica(s)): {summary.line()}")
        return 1 if summary.internal else 0
    from ..scoring.reward_model import RewardModel

    with RewardModel.from_pretrained(args.model, settings=settings) as model:
        summary = run(batch.input, batch.output, LocalExecutor(model, batch_rows=batch.flush_every), **common)
    print(f"nvrm batch: {summary.line()}")
    return 1 if summary.internal else 0  # every row is written either way; 1 says some need another run
