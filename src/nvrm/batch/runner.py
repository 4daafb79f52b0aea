"""The batch run: one skeleton, executors that only turn units into rows.

    run(manifest, output, executor)    reads the manifest, works out what the output lacks
                                       (--resume), hands those units to the executor, writes
                                       the rows it yields durably, reports progress and tallies

An executor maps pending ``Unit``s to output rows (``executor.rows(units)``
yields lists of rows, every (id, candidate index) exactly once):

- ``LocalExecutor(model)``: this process's ``RewardModel``; consecutive group
  rows stream through ``score_groups`` (the next groups are prepared while one
  is on the model), single-candidate rows go through ``score_batch``;
- ``RayExecutor`` (``batch/ray_runner.py``): a Ray Data pipeline.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol, Sequence, TextIO

from ..errors import ConfigError, InternalError, NvrmError
from .._fields import meta
from ..results import result_row
from .manifest import RowProblem, Unit, pending, read_manifest, stale
from .sink import open_sink

log = logging.getLogger(__name__)

DEFAULT_FLUSH_EVERY = 32


@dataclass(frozen=True)
class BatchSettings:
    """What one ``nvrm batch`` run reads and writes (its flags are generated from these fields)."""

    input: str = field(default="", metadata=meta("manifest.jsonl (rows with id, prompt, context, candidate(s))", required=True))
    output: str = field(default="", metadata=meta("scores file: .jsonl, .csv or .parquet", required=True))
    resume: bool = field(default=False, metadata=meta("skip rows already in the output and append the rest"))
    overwrite: bool = field(default=False, metadata=meta("replace an existing output"))
    flush_every: int = field(default=DEFAULT_FLUSH_EVERY, metadata=meta("rows scored between durable writes"))

    def __post_init__(self) -> None:
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other: keep the output's rows, or replace them")
        if self.flush_every < 1:
            raise ConfigError(f"--flush-every {self.flush_every}: must be at least 1")


class Executor(Protocol):
    def rows(self, units: Sequence[Unit]) -> Iterable[list[dict[str, Any]]]:
        """Output rows for ``units``: every (id, candidate index) of every unit exactly once."""


@dataclass(frozen=True)
class BatchSummary:
    rows: int
    """Rows written by this run."""
    scored: int
    failed: int
    skipped: int
    """Rows already in the output (``--resume``)."""
    seconds: float
    output: str
    off_contract: int = 0
    """Scored rows whose reward used an off-contract opt-in (their rows list why)."""
    internal: int = 0
    """Failed rows whose cause was not their input (``internal error``: out of memory, a crash)."""
    changed: int = 0
    """Rows of the output whose manifest row changed since (``--resume``): scored again, counted in ``rows``."""
    removed: int = 0
    """Rows of the output no longer in the manifest (``--resume``): removed from it."""

    def line(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        off = f" ({self.off_contract} off-contract: see each row's off_contract)" if self.off_contract else ""
        internal = f" ({self.internal} for internal reasons, not their input: see their error)" if self.internal else ""
        stale = f" ({self.changed} of them changed in the manifest)" if self.changed else ""
        removed = f", removed {self.removed} no longer in the manifest" if self.removed else ""
        return (
            f"scored {self.scored}{off}, failed {self.failed}{internal}{stale}, skipped {self.skipped} already in the output{removed}; "
            f"{self.rows} rows in {self.seconds:.1f} s ({rate:.2f} rows/s) -> {self.output}"
        )


def problem_rows(unit: Unit, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Error rows for a manifest line that cannot be scored."""
    error = NvrmError(unit.row.message)  # type: ignore[union-attr]
    return [result_row(unit.row, i, error, meta) for i in unit.indices]


class LocalExecutor:
    """Scores units with a ``RewardModel`` in this process."""

    def __init__(self, model, batch_rows: int = DEFAULT_FLUSH_EVERY):
        self.model = model
        self.batch_rows = max(1, batch_rows)
        self.meta = {"contract": model.fingerprint, "model_revision": model.revision}

    def rows(self, units: Sequence[Unit]) -> Iterator[list[dict[str, Any]]]:
        def kind(u: Unit) -> str:
            return "problem" if isinstance(u.row, RowProblem) else ("group" if u.row.group else "single")

        for k, run in itertools.groupby(units, key=kind):
            run = list(run)
            if k == "problem":
                for u in run:
                    yield problem_rows(u, self.meta)
            elif k == "group":
                yield from self._groups(run)
            else:
                for start in range(0, len(run), self.batch_rows):
                    yield self._singles(run[start : start + self.batch_rows])

    def _groups(self, units: list[Unit]) -> Iterator[list[dict[str, Any]]]:
        stream = ((u.row.prompt, u.row.context, [u.row.candidates[i] for i in u.indices]) for u in units)  # type: ignore[union-attr]
        done = 0
        try:
            for u, results in zip(units, self.model.score_groups(stream, errors="return")):
                done += 1
                yield [result_row(u.row, i, r, self.meta) for i, r in zip(u.indices, results)]
        except Exception:  # noqa: BLE001 - a bug in the stream must not lose the remaining rows
            log.warning("the group stream failed; scoring the remaining groups one by one", exc_info=True)
            for u in units[done:]:
                cands = [u.row.candidates[i] for i in u.indices]  # type: ignore[union-attr]
                try:
                    results = self.model.score_group(u.row.prompt, u.row.context, cands, errors="return")  # type: ignore[union-attr]
                except NvrmError as err:
                    results = [err] * len(cands)
                except Exception as own:  # noqa: BLE001 - this group's own failure, in its own rows
                    log.warning("group %s failed on its own as well", u.row.id, exc_info=True)  # type: ignore[union-attr]
                    results = [InternalError.wrap(own)] * len(cands)
                yield [result_row(u.row, i, r, self.meta) for i, r in zip(u.indices, results)]

    def _singles(self, units: list[Unit]) -> list[dict[str, Any]]:
        items = [(u.row.prompt, u.row.context, u.row.candidates[0]) for u in units]  # type: ignore[union-attr]
        # errors="return": a bad item fails its slot, and a failed batch is retried item by item inside
        results = self.model.score_batch(items, errors="return")
        return [result_row(u.row, 0, r, self.meta) for u, r in zip(units, results)]


class Tally:
    """Writes rows durably and counts them for the progress bar and the summary."""

    def __init__(self, sink, bar: "Progress", flush_every: int):
        self.sink, self.bar = sink, bar
        self.flush_every = max(1, flush_every)
        self.scored = self.failed = self.off_contract = self.internal = 0
        self._held: list[dict[str, Any]] = []

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._held += rows
        if len(self._held) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        rows, self._held = self._held, []
        if not rows:
            return
        self.sink.write(rows)
        bad = sum(r["error"] is not None for r in rows)
        self.off_contract += sum(bool(r.get("off_contract")) for r in rows)
        self.internal += sum(str(r["error"]).startswith("internal error") for r in rows if r["error"] is not None)
        self.scored += len(rows) - bad
        self.failed += bad
        self.bar.update(len(rows), bad)


class Progress:
    """A progress bar on a terminal; plain log lines (every few seconds) otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, every_s: float = 5.0):
        self.total = total
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self.done = 0
        self.failed = 0
        self.t0 = time.perf_counter()
        self._last = self.t0
        self._bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="row", file=self.stream, dynamic_ncols=True, desc="nvrm batch")

    def update(self, rows: int, failed: int) -> None:
        self.done += rows
        self.failed += failed
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix(failed=self.failed)
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            print(
                f"nvrm batch: {self.done}/{self.total} rows, {rate:.2f} rows/s, ETA {eta:.0f} s, {self.failed} failed",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run(
    manifest: str | Path,
    output: str | Path,
    executor: Executor,
    *,
    resume: bool = False,
    overwrite: bool = False,
    flush_every: int = DEFAULT_FLUSH_EVERY,
    progress: TextIO | None = None,
) -> BatchSummary:
    """Score every (id, candidate) of ``manifest`` missing from ``output``; write each row once, durably.

    Args:
        manifest: the run's JSONL manifest (see ``batch/manifest.py``).
        output: ``.jsonl``, ``.csv`` or ``.parquet``; refused if it is the manifest itself.
        executor: what turns units into rows (``LocalExecutor`` or ``RayExecutor``).
        resume, overwrite: continue an existing output, or replace it.
        flush_every: rows written (and fsynced) together.
        progress: where progress goes (default stderr).

    Returns:
        The run's ``BatchSummary``.
    """
    t0 = time.perf_counter()
    rows = read_manifest(manifest)
    sink = open_sink(output, resume=resume, overwrite=overwrite, manifest=manifest)
    try:
        staleness = stale(rows, sink.rows)
        sink.drop(staleness.keys)
        for line in staleness.lines():
            print(f"nvrm batch --resume: {line}", file=progress or sys.stderr)
        units, skipped = pending(rows, sink.done)
        bar = Progress(sum(len(u.indices) for u in units), progress)
        tally = Tally(sink, bar, flush_every)
        try:
            if units:
                for out in executor.rows(units):
                    tally.write(out)
            tally.flush()
        except KeyboardInterrupt:
            tally.flush()  # keep what is scored; --resume does the rest
            raise
        finally:
            bar.close()
        sink.finish()
    finally:
        sink.close()
    return BatchSummary(tally.scored + tally.failed, tally.scored, tally.failed, skipped, time.perf_counter() - t0, str(output),
                        tally.off_contract, tally.internal, len(staleness.changed), len(staleness.removed))
