"""Batch runs over manifests (``nvrm batch``): parse (pure), score through an executor, write rows durably, resume.

*Job* in nvrm means the service's asynchronous request (``POST /v1/jobs``); this package was ``nvrm.jobs`` until
issue 55 (``nvrm.jobs`` still imports, with a ``DeprecationWarning``).
"""

from .runner import BatchSummary, LocalExecutor, run
from .manifest import ManifestRow, RowProblem, Unit, read_manifest
from .sink import open_sink

__all__ = ["ManifestRow", "RowProblem", "Unit", "read_manifest", "BatchSummary", "LocalExecutor", "run", "run_batch", "open_sink"]


def run_batch(model, manifest, output, **kwargs) -> BatchSummary:
    """``run`` with this process's model (``LocalExecutor``); keyword arguments as for ``run``."""
    flush = kwargs.get("flush_every", 32)
    return run(manifest, output, LocalExecutor(model, batch_rows=flush), **kwargs)
