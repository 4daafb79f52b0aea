"""Batch jobs over manifests: parse (pure), score through an executor, write rows durably, resume."""

from .runner import BatchSummary, LocalExecutor, run
from .manifest import ManifestRow, RowProblem, Unit, read_job_manifest
from .sink import open_sink

__all__ = ["ManifestRow", "RowProblem", "Unit", "read_job_manifest", "BatchSummary", "LocalExecutor", "run", "run_batch", "open_sink"]


def run_batch(model, manifest, output, **kwargs) -> BatchSummary:
    """``run`` with this process's model (``LocalExecutor``); keyword arguments as for ``run``."""
    flush = kwargs.get("flush_every", 32)
    return run(manifest, output, LocalExecutor(model, batch_rows=flush), **kwargs)
