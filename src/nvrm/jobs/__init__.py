"""Batch jobs over manifests: parse (pure), score, write rows durably, resume."""

from .manifest import ManifestRow, RowProblem, Unit, read_manifest
from .runner import BatchSummary, run_batch
from .sink import open_sink

__all__ = ["ManifestRow", "RowProblem", "Unit", "read_manifest", "BatchSummary", "run_batch", "open_sink"]
