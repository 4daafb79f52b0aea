"""``nvrm batch``: a manifest of clips scored into a resumable JSONL / CSV / Parquet file."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from .model_flags import add_model_args
from .options import add_ray_args


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm batch``: model loading, the job (generated from ``JobSettings``), and the Ray options."""
    from ..jobs.runner import JobSettings
    from .options import add_dataclass_args

    add_model_args(p)
    add_dataclass_args(p, JobSettings, group="job")
    ray = add_ray_args(p, what="scale past one process or machine", replica="a Ray Data pipeline with an actor pool of scorers")
    ray.add_argument("--cpus-per-preprocess", type=float, default=1.0, help="CPUs per preprocessing task")


def run_batch(args: argparse.Namespace) -> int:
    """``nvrm batch``: score a manifest into a durable, resumable output (locally or on Ray). Returns 0, or 1
    when some rows failed for internal reasons (out of memory, a crash) rather than their input."""
    from ..jobs import LocalExecutor, run
    from ..jobs.manifest import read_job_manifest
    from ..jobs.sink import output_format
    from .model_flags import settings_from_args

    from ..jobs.runner import JobSettings
    from .options import dataclass_from_args

    job = dataclass_from_args(args, JobSettings)
    output_format(Path(job.output))  # refuse an unknown extension before loading the model
    read_job_manifest(job.input)  # and a manifest that cannot be read
    settings = settings_from_args(args)
    common = dict(resume=job.resume, overwrite=job.overwrite, flush_every=job.flush_every)
    if args.ray:
        from ..jobs.ray_runner import RayExecutor, _require_ray

        if args.replicas < 1:
            raise InputError(f"--replicas {args.replicas}", "must be at least 1")
        _require_ray()
        executor = RayExecutor(
            args.model,
            settings=settings,
            address=args.ray_address,
            replicas=args.replicas,
            gpus_per_replica=args.gpus_per_replica,
            cpus_per_preprocess=args.cpus_per_preprocess,
        )
        summary = run(job.input, job.output, executor, **common)
        print(f"nvrm batch (ray, {args.replicas} replica(s)): {summary.line()}")
        return 1 if summary.internal else 0
    from ..scoring.reward_model import RewardModel

    with RewardModel.from_pretrained(args.model, settings=settings) as model:
        summary = run(job.input, job.output, LocalExecutor(model, batch_rows=job.flush_every), **common)
    print(f"nvrm batch: {summary.line()}")
    return 1 if summary.internal else 0  # every row is written either way; 1 says some need another run
