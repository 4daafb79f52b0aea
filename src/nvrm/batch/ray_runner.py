"""``nvrm batch --ray``: the same run as a Ray Data pipeline.

    manifest (driver) -> pending units (resume) -> Ray Dataset
      -> map(prepare, num_cpus=...)              CPU tasks: decode + per-frame contract, streamed
      -> map_batches(Scorer, concurrency=N)      actor pool: one RewardModel per replica, loaded once
      -> driver writes rows through the same durable sink as the single-process run

A group (shared context) is one dataset row, so it is scored on one replica
with shared-context reuse. Per-row errors travel as data and become error
rows; nothing is dropped. Ray moves Python objects between its own
processes with its serializer; no file or request is ever unpickled.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..cluster.ray_tasks import error_text, require_ray, task_engine
from .runner import BatchSummary, run
from .manifest import ManifestRow, RowProblem, Unit

log = logging.getLogger(__name__)


def unit_record(u) -> dict[str, Any]:
    """A pending unit as a plain record (what the dataset carries)."""
    r = u.row
    rec = {
        "id": r.id,
        "indices": list(u.indices),
        "labels": list(r.labels),
        "problem": r.message if isinstance(r, RowProblem) else "",  # "" = none (Ray columns turn None into NaN)
        "prompt": getattr(r, "prompt", ""),
        "context": getattr(r, "context", ""),
        "candidates": list(getattr(r, "candidates", ())),
        "group": bool(getattr(r, "group", False)),
        "line": r.line,
        "input_keys": [r.input_key(i) for i in range(len(r.keys()))],  # of the files, before they become prepared videos
    }
    return rec


def _video_record(v) -> dict[str, Any]:
    return {
        "frames": [np.asarray(im) for im in v.images],
        "times": list(v.times),
        "source": v.source,
        "role": v.role,
        "contract": v.contract,
        "pixels": np.asarray(v.pixels),
        "grid": np.asarray(v.grid),
    }


def _video_from(rec: dict[str, Any]):
    import torch
    from PIL import Image

    from ..video.inputs import PreparedVideo

    return PreparedVideo(
        tuple(Image.fromarray(f) for f in rec["frames"]),
        tuple(rec["times"]),
        rec["source"],
        rec["role"],
        rec["contract"],
        torch.from_numpy(np.asarray(rec["pixels"])),
        torch.from_numpy(np.asarray(rec["grid"])),
    )


def make_prepare(bundle: str):
    """CPU task body: a unit's context and candidates through the engine, errors as data."""

    def prepare(rec: dict[str, Any]) -> dict[str, Any]:
        engine = task_engine(bundle)
        out = dict(rec)
        out["context_error"] = ""
        out["prepared_context"] = {}
        out["prepared"] = []
        if rec["problem"]:
            return out
        try:
            out["prepared_context"] = _video_record(engine.prepare(rec["context"], "context"))
        except Exception as e:  # noqa: BLE001 - every failure is this unit's data
            out["context_error"] = error_text(e)
            return out
        for i in rec["indices"]:
            try:
                out["prepared"].append({"ok": _video_record(engine.prepare(rec["candidates"][i], "candidate")), "error": ""})
            except Exception as e:  # noqa: BLE001
                out["prepared"].append({"ok": {}, "error": error_text(e)})
        return out

    return prepare


class Scorer:
    """Actor: loads the bundle once and turns prepared units into output rows (``LocalExecutor``)."""

    def __init__(self, bundle: str, settings):
        from ..scoring.reward_model import RewardModel

        self.model = RewardModel.from_pretrained(bundle, settings=settings)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from .runner import LocalExecutor

        units = [_unit_from({key: batch[key][k] for key in batch}) for k in range(len(batch["id"]))]
        rows = [row for out in LocalExecutor(self.model).rows(units) for row in out]
        return {"row": [json.dumps(r) for r in rows]}


def _unit_from(rec: dict[str, Any]) -> Unit:
    """A unit whose inputs are the prepared videos (a failed one keeps its path: it fails the same way again)."""
    indices = tuple(int(i) for i in rec["indices"])
    labels = tuple(rec["labels"])
    if rec["problem"]:
        return Unit(RowProblem(int(rec["line"]), str(rec["id"]), len(labels), labels, str(rec["problem"])), indices)
    context: Any = rec["context"] if rec["context_error"] else _video_from(rec["prepared_context"])
    candidates = list(rec["candidates"])
    if not rec["context_error"]:
        for i, p in zip(indices, rec["prepared"]):
            if not p["error"]:
                candidates[i] = _video_from(p["ok"])
    row = ManifestRow(int(rec["line"]), str(rec["id"]), str(rec["prompt"]), context, tuple(candidates), labels, bool(rec["group"]),
                      tuple(str(k) for k in rec["input_keys"]))
    return Unit(row, indices)


class RayExecutor:
    """Maps units to rows on Ray: CPU tasks prepare, an actor pool of model replicas scores."""

    def __init__(
        self,
        bundle: str,
        *,
        settings=None,
        address: str | None = None,
        replicas: int = 1,
        gpus_per_replica: float = 0.0,
        cpus_per_preprocess: float = 1.0,
        rows_per_batch: int = 8,
    ):
        from ..settings import LoadSettings

        self.bundle = bundle
        self.settings = settings or LoadSettings()
        self.address = address
        self.replicas = replicas
        self.gpus_per_replica = gpus_per_replica
        self.cpus_per_preprocess = cpus_per_preprocess
        self.rows_per_batch = rows_per_batch

    def rows(self, units):
        ray = require_ray()
        from ..bundle import resolve_bundle

        started_here = False
        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
            started_here = True
        try:
            path = resolve_bundle(self.bundle, self.settings.revision)
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = False
            ds = ray.data.from_items([unit_record(u) for u in units], override_num_blocks=max(1, min(len(units), 4 * self.replicas)))
            ds = ds.map(make_prepare(str(path)), num_cpus=self.cpus_per_preprocess)
            ds = ds.map_batches(
                Scorer,
                fn_constructor_kwargs={"bundle": str(path), "settings": self.settings},
                batch_size=self.rows_per_batch,
                compute=ray.data.ActorPoolStrategy(size=self.replicas),
                num_gpus=self.gpus_per_replica or None,
                # a CPU request unlike the preprocessing tasks' keeps Ray from fusing the two
                # stages, so preprocessing scales on its own CPU tasks
                num_cpus=(0.5 if self.cpus_per_preprocess == 1 else 1) if not self.gpus_per_replica else None,
            )
            for batch in ds.iter_batches(batch_size=None, batch_format="default"):
                yield [json.loads(x) for x in batch["row"]]
        finally:
            if started_here:
                ray.shutdown()


def run_batch_ray(manifest: str | Path, output: str | Path, *, bundle: str, settings=None,
                  resume: bool = False, overwrite: bool = False, progress=None, **ray_options: Any) -> BatchSummary:
    """The batch run on Ray; writes exactly what the local run writes."""
    require_ray()
    executor = RayExecutor(bundle, settings=settings, **ray_options)
    return run(manifest, output, executor, resume=resume, overwrite=overwrite, progress=progress)
