"""Deprecated: the batch runs over manifests are ``nvrm.batch`` (issue 55: *job* is the service's asynchronous request).

``import nvrm.jobs``, ``from nvrm.jobs import run_batch`` and ``from nvrm.jobs.sink import open_sink`` keep working
and warn once: each ``nvrm.jobs.X`` is the module ``nvrm.batch.X`` itself (one object, not a copy). The old names
``read_job_manifest`` and ``JobSettings`` (``nvrm.batch``'s ``read_manifest`` and ``BatchSettings``) import from
``nvrm.jobs`` itself.
"""

from __future__ import annotations

import importlib
import sys
import warnings

from ..batch import BatchSummary, LocalExecutor, ManifestRow, RowProblem, Unit, open_sink, read_manifest, run, run_batch
from ..batch.runner import BatchSettings

warnings.warn("nvrm.jobs is now nvrm.batch (read_job_manifest: read_manifest, JobSettings: BatchSettings); import nvrm.batch",
              DeprecationWarning, stacklevel=2)

for _name in ("journal", "manifest", "runner", "sink", "ray_runner"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"nvrm.batch.{_name}")

read_job_manifest = read_manifest
JobSettings = BatchSettings

__all__ = ["ManifestRow", "RowProblem", "Unit", "read_job_manifest", "BatchSummary", "LocalExecutor", "run", "run_batch", "open_sink"]
