"""Run a batch job: score what the output lacks, write rows durably, report progress."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from ..errors import NvrmError
from .manifest import ManifestRow, RowProblem, Unit, pending, read_manifest
from .sink import open_sink

log = logging.getLogger(__name__)

DEFAULT_FLUSH_EVERY = 32


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

    def line(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        return (
            f"scored {self.scored}, failed {self.failed}, skipped {self.skipped} already in the output; "
            f"{self.rows} rows in {self.seconds:.1f} s ({rate:.2f} rows/s) -> {self.output}"
        )


def _one_line(e: BaseException) -> str:
    if isinstance(e, NvrmError):
        return str(e)
    return " ".join(f"internal error: {type(e).__name__}: {e}".split())


def result_row(row: ManifestRow | RowProblem, index: int, result: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """One output row for candidate ``index`` of ``row``: a ScoreResult or an error."""
    out = {
        "id": row.id,
        "candidate_index": int(index),
        "candidate": row.labels[index] if index < len(row.labels) else "",
        "reward": None,
        "error": None,
        "num_tokens": None,
        "contract": meta["contract"],
        "model_revision": meta["model_revision"],
    }
    if isinstance(result, BaseException):
        out["error"] = _one_line(result)
    else:
        out["reward"] = result.reward
        out["num_tokens"] = result.num_tokens
    return out


def _safe(fn: Callable[[], list[Any]], n: int) -> list[Any]:
    """Run a scoring call; an unexpected failure becomes that many error results."""
    try:
        return fn()
    except NvrmError as e:
        return [e] * n
    except Exception as e:  # noqa: BLE001 - one bad unit must not stop the job
        log.warning("scoring failed unexpectedly", exc_info=True)
        return [e] * n


def score_units(model, units: Sequence[Unit]) -> list[dict[str, Any]]:
    """Output rows for ``units``: groups via ``score_group``, single rows via ``score_batch``.

    Never raises for a bad input; every (id, candidate index) in ``units``
    gets exactly one row.
    """
    meta = {"contract": model.contract.fingerprint, "model_revision": model.revision}
    rows: list[dict[str, Any]] = []
    singles: list[Unit] = []
    for u in units:
        r = u.row
        if isinstance(r, RowProblem):
            rows.extend(result_row(r, i, NvrmError(r.message), meta) for i in u.indices)
        elif r.group:
            cands = [r.candidates[i] for i in u.indices]
            results = _safe(lambda: model.score_group(r.prompt, r.context, cands, errors="return"), len(cands))
            rows.extend(result_row(r, i, res, meta) for i, res in zip(u.indices, results))
        else:
            singles.append(u)
    if singles:
        items = [(u.row.prompt, u.row.context, u.row.candidates[0]) for u in singles]  # type: ignore[union-attr]
        results = _safe(lambda: model.score_batch(items, errors="return"), len(items))
        if any(isinstance(x, Exception) and not isinstance(x, NvrmError) for x in results) and len(items) > 1:
            # an unexpected failure of the whole batch: retry item by item so one item cannot sink the rest
            results = [_safe(lambda it=it: model.score_batch([it], errors="return"), 1)[0] for it in items]
        rows.extend(result_row(u.row, 0, res, meta) for u, res in zip(singles, results))
    return rows


def chunk_units(units: Sequence[Unit], rows_per_chunk: int) -> list[list[Unit]]:
    """Consecutive units in chunks of about ``rows_per_chunk`` output rows (a group is never split)."""
    chunks: list[list[Unit]] = []
    cur: list[Unit] = []
    n = 0
    for u in units:
        cur.append(u)
        n += len(u.indices)
        if n >= rows_per_chunk:
            chunks.append(cur)
            cur, n = [], 0
    if cur:
        chunks.append(cur)
    return chunks


class Tally:
    """Writes rows durably and counts them for the progress bar and the summary."""

    def __init__(self, sink, bar: "Progress"):
        self.sink, self.bar = sink, bar
        self.scored = self.failed = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.sink.write(rows)
        bad = sum(r["error"] is not None for r in rows)
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


def run_batch(
    model,
    manifest: str | Path,
    output: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    flush_every: int = DEFAULT_FLUSH_EVERY,
    progress: TextIO | None = None,
) -> BatchSummary:
    """Score every (id, candidate) of ``manifest`` missing from ``output``."""
    t0 = time.perf_counter()
    rows = read_manifest(manifest)
    sink = open_sink(output, resume=resume, overwrite=overwrite)
    try:
        units, skipped = pending(rows, sink.done)
        bar = Progress(sum(len(u.indices) for u in units), progress)
        tally = Tally(sink, bar)
        try:
            for chunk in chunk_units(units, max(1, flush_every)):
                tally.write(score_units(model, chunk))
        finally:
            bar.close()
        sink.finish()
    finally:
        sink.close()
    seconds = time.perf_counter() - t0
    return BatchSummary(tally.scored + tally.failed, tally.scored, tally.failed, skipped, seconds, str(output))
