"""``nvrm serve --watch NAME=DIR``: swap model NAME when a new export lands in DIR.

    every --watch-interval-s: DIR's bundle (DIR itself, or its newest visible sub-folder with a manifest)
        ─► a manifest whose sha256 differs from the served revision? ─► ``model_swap.swap`` (the PUT path:
        verify, load beside, same contract, warm up, switch atomically)

``nvrm train`` exports into a hidden temporary folder and renames it into place, so a folder that is
half written has no manifest under DIR's visible names and is never picked. A bundle that fails (its
verification, its contract, its warm-up) is logged once and not loaded; what is served stays. It is
tried again only once its files change (a copy that was still running when it was first seen).

"Newest" is an order written inside the exports, which file-system housekeeping (a ``chmod``, an ``rsync``,
a file removed from an old export) cannot change, where modification and change times can (issue 54):
``export_order``, the time ``nvrm train`` recorded in the bundle's training record (``nvrm_training.json``'s
``exported_at``; ``nvrm refresh`` exports its training's bundle, so it carries that time too), then the folder's
name in natural order (``step-900`` before ``step-1000``), which alone orders bundles that record no export time
(those rank below every bundle that records one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
from datetime import datetime
from pathlib import Path
from typing import Any

from ...bundle import MANIFEST_NAMES
from ...errors import ConfigError
from ...protocol import ErrorCode
from ..config import parse_watch_specs  # noqa: F401  (the --watch values, parsed where they are validated)

log = logging.getLogger(__name__)


def _has_manifest(folder: Path) -> bool:
    return any((folder / m).is_file() for m in MANIFEST_NAMES)


def bundle_in(folder: str | Path) -> Path | None:
    """The bundle ``folder`` holds now: itself if it has a manifest, else its newest sub-folder with one by
    ``export_order`` (hidden names, such as an export's temporary folder, are skipped); None when there is none yet."""
    folder = Path(folder)
    if _has_manifest(folder):
        return folder
    try:
        subs = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and _has_manifest(p)]
    except OSError:  # not there yet (nvrm train has not exported), or being replaced
        return None
    return max(subs, key=export_order, default=None)


TRAINING_RECORD = "nvrm_training.json"
"""The training record ``nvrm train`` writes into its export (``nvrm.train.export``), with its ``exported_at``."""
MAX_RECORD_BYTES = 4 << 20
"""The most of a training record read for its export time (a larger one counts as recording none)."""


def exported_at(bundle: Path) -> float | None:
    """The export time (seconds since the epoch) the bundle's training record holds; None when it records none
    (no record, not a regular file, too large, not JSON, no or a malformed ``exported_at``)."""
    path = bundle / TRAINING_RECORD
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the poll: only regular files are opened
            return None
        with open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
        when = json.loads(raw).get("exported_at") if len(raw) <= MAX_RECORD_BYTES else None
        return datetime.fromisoformat(when).timestamp() if isinstance(when, str) else None
    except (OSError, ValueError, AttributeError, OverflowError):
        return None


def _natural(name: str) -> tuple:
    """``name`` ordered with its digit runs as numbers (``step-900`` before ``step-1000``)."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t)


def export_order(bundle: Path) -> tuple:
    """The key ``bundle_in`` takes the greatest of: (whether the bundle records an export time, that time, its
    folder name in natural order). Read from inside the bundle and its name only, never from file times."""
    when = exported_at(bundle)
    return (when is not None, when or 0.0, _natural(bundle.name))


def files_state(folder: Path) -> tuple:
    """What changes when a bundle's files do: (name, size, mtime) of each file in it."""
    try:
        return tuple(sorted((p.name, s.st_size, s.st_mtime_ns) for p in folder.iterdir() if p.is_file() for s in (p.stat(),)))
    except OSError:
        return ()


class Watcher:
    """Polls each watched folder and swaps its model to a new complete bundle found there."""

    def __init__(self, models: Any, specs: list[tuple[str, str]], interval_s: float):
        self.models, self.specs, self.interval_s = models, specs, interval_s
        self.refused: dict[str, tuple] = {}
        """name -> (digest, files) of the bundle last refused (logged once; tried again when its files change)"""

    def check_names(self, names: list[str]) -> None:
        """``ConfigError`` naming the served models if a watched name is not one of them."""
        for name, where in self.specs:
            if name not in names:
                raise ConfigError(f"--watch {name}={where}: {name!r} is not a served model; the models are: {', '.join(names)}")

    async def run(self) -> None:
        """Poll until cancelled (the server's lifespan owns this task)."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 — a watcher's failure never takes down the service
                log.exception("--watch: polling failed; trying again in %.1f s", self.interval_s)

    async def poll(self) -> list[str]:
        """One look at every watched folder; returns the names swapped."""
        from .model_swap import swap
        from .weights import manifest_sha256

        swapped: list[str] = []
        if self.models.not_ready() is not None:
            return swapped
        for name, where in self.specs:
            bundle = bundle_in(where)
            digest = manifest_sha256(bundle) if bundle is not None else None
            if digest is None or digest == self.models.registry.current(name).digest:
                continue
            state = (digest, files_state(bundle))
            if self.refused.get(name) == state:
                continue
            reply = await swap(self.models, name, str(bundle))
            if reply.status == 200:
                self.refused.pop(name, None)
                swapped.append(name)
                log.info("--watch: model %s now serves %s (revision %s)", name, bundle, reply.body.get("revision"))
            elif reply.body.get("error", {}).get("code") != ErrorCode.SWAP_IN_PROGRESS:  # busy: the next poll tries again
                self.refused[name] = state
                message = reply.body.get("error", {}).get("message", f"status {reply.status}")
                log.error("--watch: model %s: %s not loaded (%s); still serving revision %s",
                          name, bundle, message, self.models.registry.current(name).digest)
        return swapped
