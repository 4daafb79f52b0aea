"""``nvrm batch --ray``: the same job as a Ray Data pipeline.

    manifest (driver) -> pending units (resume) -> Ray Dataset
      -> map(prepare, num_cpus=...)              CPU tasks: decode + per-frame contract, streamed
      -> map_batches(Scorer, concurrency=N)      actor pool: one RewardModel per replica, loaded once
      -> driver writes rows through the same durable sink as the single-process job

A group (shared context) is one dataset row, so it is scored on one replica
with shared-context reuse. Per-row errors travel as data and become error
rows; nothing is dropped. Ray moves Python objects between its own
processes with its serializer; no file or request is ever unpickled.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, NvrmError
from .manifest import ManifestRow, RowProblem, pending, read_manifest
from .runner import BatchSummary, Progress, Tally, result_row
from .sink import open_sink

log = logging.getLogger(__name__)


def _require_ray():
    try:
        import ray  # noqa: F401
    except ImportError as e:  # pragma: no cover - ray is installed with the test extra
        raise InputError("--ray", "Ray is not installed; pip install 'nvrm[ray]'") from e
    import ray

    return ray


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

    from ..inputs import PreparedVideo

    return PreparedVideo(
        tuple(Image.fromarray(f) for f in rec["frames"]),
        tuple(rec["times"]),
        rec["source"],
        rec["role"],
        rec["contract"],
        torch.from_numpy(np.asarray(rec["pixels"])),
        torch.from_numpy(np.asarray(rec["grid"])),
    )


_ENGINES: dict[str, Any] = {}


def _engine(bundle: str):
    """This task process's engine for ``bundle`` (inline: Ray's tasks are the parallelism)."""
    if bundle not in _ENGINES:
        from ..engine import Engine

        _ENGINES[bundle] = Engine.for_bundle(bundle, workers=0)
    return _ENGINES[bundle]


def make_prepare(bundle: str):
    """CPU task body: apply the contract to a unit's context and candidates, through the engine."""

    def prepare(rec: dict[str, Any]) -> dict[str, Any]:
        engine = _engine(bundle)
        out = dict(rec)
        out["context_error"] = ""
        out["prepared_context"] = {}
        out["prepared"] = []
        if rec["problem"]:
            return out
        try:
            out["prepared_context"] = _video_record(engine.prepare(rec["context"], "context"))
        except NvrmError as e:
            out["context_error"] = str(e)
            return out
        except Exception as e:  # noqa: BLE001
            out["context_error"] = f"internal error: {type(e).__name__}: {e}"
            return out
        for i in rec["indices"]:
            try:
                out["prepared"].append({"ok": _video_record(engine.prepare(rec["candidates"][i], "candidate")), "error": ""})
            except NvrmError as e:
                out["prepared"].append({"ok": {}, "error": str(e)})
            except Exception as e:  # noqa: BLE001
                out["prepared"].append({"ok": {}, "error": f"internal error: {type(e).__name__}: {e}"})
        return out

    return prepare


class Scorer:
    """Actor: loads the bundle once and turns prepared units into output rows."""

    def __init__(self, bundle: str, revision: str | None, device: str | None, verify: bool, max_batch_tokens: int | None):
        from ..scoring import RewardModel

        self.model = RewardModel.from_pretrained(bundle, revision=revision, device=device, verify=verify, max_batch_tokens=max_batch_tokens)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        meta = {"contract": self.model.contract.fingerprint, "model_revision": self.model.revision}
        rows: list[dict[str, Any]] = []
        n = len(batch["id"])
        singles: list[tuple[ManifestRow, int, Any, Any]] = []
        for k in range(n):
            rec = {key: batch[key][k] for key in batch}
            row = _row_view(rec)
            indices = list(rec["indices"])
            if rec["problem"]:
                rows += [result_row(row, i, NvrmError(rec["problem"]), meta) for i in indices]
                continue
            if rec["context_error"]:
                rows += [result_row(row, i, NvrmError(rec["context_error"]), meta) for i in indices]
                continue
            ctx = _video_from(rec["prepared_context"])
            cands = [(i, p) for i, p in zip(indices, rec["prepared"])]
            bad = [(i, p["error"]) for i, p in cands if p["error"]]
            rows += [result_row(row, i, NvrmError(msg), meta) for i, msg in bad]
            good = [(i, _video_from(p["ok"])) for i, p in cands if not p["error"]]
            if not good:
                continue
            if rec["group"]:
                try:
                    results = self.model.score_group(row.prompt, ctx, [v for _, v in good], errors="return")
                except Exception as e:  # noqa: BLE001
                    results = [e] * len(good)
                rows += [result_row(row, i, r, meta) for (i, _), r in zip(good, results)]
            else:
                singles += [(row, i, ctx, v) for i, v in good]
        if singles:
            try:
                results = self.model.score_batch([(r.prompt, c, v) for r, _, c, v in singles], errors="return")
            except Exception as e:  # noqa: BLE001
                results = [e] * len(singles)
            rows += [result_row(r, i, res, meta) for (r, i, _, _), res in zip(singles, results)]
        return {"row": [json.dumps(r) for r in rows]}


def _row_view(rec: dict[str, Any]) -> ManifestRow:
    return ManifestRow(
        int(rec["line"]), str(rec["id"]), str(rec["prompt"]), str(rec["context"]),
        tuple(rec["candidates"]), tuple(rec["labels"]), bool(rec["group"]),
    )


def run_batch_ray(
    manifest: str | Path,
    output: str | Path,
    *,
    bundle: str,
    revision: str | None = None,
    device: str | None = None,
    verify: bool = True,
    max_batch_tokens: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    address: str | None = None,
    replicas: int = 1,
    gpus_per_replica: float = 0.0,
    cpus_per_preprocess: float = 1.0,
    rows_per_batch: int = 8,
    progress=None,
) -> BatchSummary:
    """The batch job on Ray; writes exactly what ``run_batch`` writes."""
    ray = _require_ray()
    from ..bundle import resolve_bundle

    t0 = time.perf_counter()
    rows = read_manifest(manifest)
    sink = open_sink(output, resume=resume, overwrite=overwrite)
    try:
        units, skipped = pending(rows, sink.done)
        total = sum(len(u.indices) for u in units)
        bar = Progress(total, progress)
        tally = Tally(sink, bar)
        if units:
            started_here = False
            if not ray.is_initialized():
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
                started_here = True
            try:
                path = resolve_bundle(bundle, revision)
                ctx = ray.data.DataContext.get_current()
                ctx.enable_progress_bars = False
                ds = ray.data.from_items([unit_record(u) for u in units], override_num_blocks=max(1, min(len(units), 4 * replicas)))
                ds = ds.map(make_prepare(str(path)), num_cpus=cpus_per_preprocess)
                ds = ds.map_batches(
                    Scorer,
                    fn_constructor_kwargs={
                        "bundle": str(path), "revision": revision, "device": device,
                        "verify": verify, "max_batch_tokens": max_batch_tokens,
                    },
                    batch_size=rows_per_batch,
                    compute=ray.data.ActorPoolStrategy(size=replicas),
                    num_gpus=gpus_per_replica or None,
                    # a CPU request unlike the preprocessing tasks' keeps Ray from fusing the two
                    # stages, so preprocessing scales on its own CPU tasks
                    num_cpus=(0.5 if cpus_per_preprocess == 1 else 1) if not gpus_per_replica else None,
                )
                for batch in ds.iter_batches(batch_size=None, batch_format="default"):
                    tally.write([json.loads(x) for x in batch["row"]])
            finally:
                bar.close()
                if started_here:
                    ray.shutdown()
        sink.finish()
    finally:
        sink.close()
    seconds = time.perf_counter() - t0
    return BatchSummary(tally.scored + tally.failed, tally.scored, tally.failed, skipped, seconds, str(output))
