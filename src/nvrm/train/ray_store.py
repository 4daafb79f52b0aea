"""``nvrm prefs prepare --ray``: a prepared-input store built by Ray Data tasks, on one machine or a cluster.

    videos (driver: the pairs files' (path, role)s not stored yet) -> Ray Dataset
      -> map_batches(prepare_batch, num_cpus=...)   CPU tasks: each prepares its batch through the engine
                                                   and writes it as its own shard of the store folder
      -> the driver sums what the tasks report

Every node must see the store folder and the videos at the same paths (a shared filesystem), as for
``nvrm batch --ray``. Shards are written atomically under unique names, so tasks never collide and a
build that stops resumes (``nvrm.train.store``). What the task needs of Ray and of the engine is
``nvrm.cluster.ray_tasks``, shared with ``nvrm batch --ray``.
"""

from __future__ import annotations

import json
from typing import Any

from ..cluster.ray_tasks import error_text, require_ray, task_engine


def make_prepare_batch(bundle: str, folder: str, fingerprint: str):
    """Task body: prepare a batch of (path, role)s and write them as one shard; counts and failures as data."""

    def prepare_batch(batch: dict[str, Any]) -> dict[str, Any]:
        from .store import StoreWriter, content_key

        engine = task_engine(bundle)
        writer = StoreWriter(folder, fingerprint)
        stored, failures = 0, []
        for path, role in zip(batch["path"], batch["role"]):
            try:
                writer.add(content_key(path, role), str(path), engine.prepare(str(path), str(role)))
                stored += 1
            except Exception as e:  # noqa: BLE001 - a failure is this video's data, not the build's end
                failures.append(json.dumps({"path": str(path), "role": str(role), "error": error_text(e)}))
        writer.close()
        return {"stored": [stored], "failures": [json.dumps(failures)]}

    return prepare_batch


def build_store_on_ray(bundle: str, todo: list[tuple[str, str]], folder: str, fingerprint: str, *, address: str | None = None,
                       cpus_per_task: float = 1.0, videos_per_task: int = 32) -> dict[str, Any]:
    """Prepare ``todo`` on Ray into ``folder``: ``{"stored": n, "failed": [(path, role, message)]}``."""
    ray = require_ray()
    started_here = False
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
        started_here = True
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        blocks = max(1, min(len(todo), 1 + len(todo) // videos_per_task))
        ds = ray.data.from_items([{"path": p, "role": r} for p, r in todo], override_num_blocks=blocks)
        ds = ds.map_batches(make_prepare_batch(bundle, folder, fingerprint), batch_size=videos_per_task, num_cpus=cpus_per_task)
        stored, failed = 0, []
        for batch in ds.iter_batches(batch_size=None, batch_format="default"):
            stored += int(sum(batch["stored"]))
            for part in batch["failures"]:
                failed += [(f["path"], f["role"], f["error"]) for f in json.loads(part)]
        return {"stored": stored, "failed": failed}
    finally:
        if started_here:
            ray.shutdown()
