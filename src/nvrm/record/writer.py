"""The record's writer: a bounded queue and one thread, off every request's path.

``submit`` never blocks: when the queue is full (in items or in bytes) the items are dropped and
counted. The thread samples each item's frames under its contract, stores them by content hash (a
file already held is not written again), appends the row to the newest manifest segment and, past
``max_bytes``, deletes the oldest segments with the files only they referenced. Any write error (a
full disk: ENOSPC) stops recording with one warning; scoring never sees it. One writer per folder (``lock``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import format as fmt
from .lock import claim, release

log = logging.getLogger("nvrm.record")

SEGMENT_ROWS = 256
"""Most rows per manifest segment (the unit ``--record-mb`` drops, oldest first; it also closes at 1/16 of the bound)."""


@dataclass
class Pending:
    """One scored item waiting to be written (its inputs as the scorer had them)."""

    prompt: str
    context: Any
    context_id: str | None
    candidate: Any
    reward: float
    revision: str
    contract: Any
    limits: Any
    group: str
    index: int
    source: str
    nbytes: int = 0
    fingerprint: str = ""
    """The fingerprint its result names (default: the contract's)."""
    uncertainty: float | None = None
    """Its result's uncertainty (the model's guard), kept in the row; None without a guard."""


@dataclass
class _Segment:
    seq: int
    rows: int = 0
    bytes: int = 0
    """Its manifest lines' bytes."""
    cost: int = 0
    """Its lines and the files its rows added (what closes it at 1/16 of the bound)."""
    files: list[str] = field(default_factory=list)


class RecordWriter:
    """Writes ``Pending`` items into the record at ``root``, keeping it under ``max_bytes``."""

    def __init__(self, root: str | os.PathLike, max_bytes: int, *, queue_bytes: int = 256 << 20, queue_items: int = 4096):
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.queue_bytes = queue_bytes
        self.queue: queue.Queue = queue.Queue(maxsize=queue_items)
        self.queued_bytes = 0
        self.written = self.dropped = self.skipped = self.bytes = 0
        self.stopped: str | None = None
        self._lock = threading.Lock()
        self._refs: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._segments: deque[_Segment] = deque()
        self._known: OrderedDict[str, tuple[str, list[float]]] = OrderedDict()  # context id -> (key, times)
        self._next = 0
        self._claim = claim(self.root)  # a second writer on this folder is refused here, in the caller
        self._thread = threading.Thread(target=self._run, name="nvrm-record", daemon=True)
        self._thread.start()
        atexit.register(self.close, 10.0)  # a trainer or a server that exits writes what is still queued first

    # ------------------------------------------------------------ the request side

    def submit(self, items: list[Pending]) -> bool:
        """Queue ``items`` without blocking; False (and counted as dropped) when full or stopped."""
        size = sum(p.nbytes for p in items)
        with self._lock:
            if self.stopped is not None or self.queued_bytes + size > self.queue_bytes:
                self.dropped += len(items)
                return False
            try:
                self.queue.put_nowait(items)
            except queue.Full:
                self.dropped += len(items)
                return False
            self.queued_bytes += size
        return True

    def stats(self) -> dict[str, Any]:
        """Rows written, items dropped (queue full or stopped) and skipped (unreadable), bytes held, why stopped."""
        return {"written": self.written, "dropped": self.dropped, "skipped": self.skipped, "bytes": self.bytes, "stopped": self.stopped}

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to ``timeout`` s), stop the thread and let another writer have the folder."""
        if self._thread.is_alive():
            try:
                self.queue.put(None, timeout=timeout)
            except queue.Full:
                pass
            self._thread.join(timeout)
        if not self._thread.is_alive():
            release(self.root, self._claim)
            self._claim = None

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far is written (tests, and a clean shutdown)."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._open()
        except OSError as e:
            self._stop(e)
        while True:
            items = self.queue.get()
            try:
                if items is None:
                    return
                with self._lock:
                    self.queued_bytes -= sum(p.nbytes for p in items)
                if self.stopped is None:
                    self._write_all(items)
            finally:
                self.queue.task_done()

    def _write_all(self, items: list[Pending]) -> None:
        for p in items:
            try:
                self._write(p)
            except OSError as e:
                self._stop(e)
                return
            except Exception as e:  # one unreadable item is skipped; the record goes on
                self.skipped += 1
                log.debug("nvrm record: skipped an item: %s", e)

    def _stop(self, e: BaseException) -> None:
        with self._lock:
            self.stopped = f"{type(e).__name__}: {e}"
        log.warning("nvrm record: stopped recording to %s (%s); scoring goes on", self.root, self.stopped)

    def _open(self) -> None:
        """Create the folder, or pick up an existing record (its rows and files count against the bound)."""
        self.root.mkdir(parents=True, exist_ok=True)
        head = self.root / fmt.HEADER
        if head.exists():
            problem = fmt.check_header(json.loads(head.read_text()))
            if problem:
                raise OSError(f"{self.root} {problem}")
        else:
            head.write_text(fmt.header())
        (self.root / fmt.ROWS).mkdir(exist_ok=True)
        for seg_path in sorted((self.root / fmt.ROWS).glob("*.jsonl")):
            seg = _Segment(int(seg_path.stem))
            for line in seg_path.read_text(errors="replace").splitlines():
                try:
                    obj = json.loads(line)
                    files = [r["path"] for r in (obj.get("context"), obj.get("candidate")) if isinstance(r, dict)]
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                seg.rows += 1
                seg.bytes += len(line.encode()) + 1
                for f in files:
                    self._ref(f, None)
                    seg.files.append(f)
            self.bytes += seg.bytes
            self._segments.append(seg)
        self._next = max(self._next, max((s.seq + s.rows for s in self._segments), default=0))

    def _ref(self, rel: str, size: int | None) -> None:
        if rel not in self._refs:
            if size is None:
                try:
                    size = (self.root / rel).stat().st_size
                except OSError:
                    size = 0
            self._sizes[rel] = size
            self.bytes += size
        self._refs[rel] = self._refs.get(rel, 0) + 1

    def _store(self, kind: str, value: Any, role: str, contract: Any, limits: Any) -> dict:
        from ..video.inputs import sample_input

        images, plan, _ = sample_input(value, role, contract, limits)
        frames = np.stack([np.asarray(im, dtype=np.uint8) for im in images])
        key = fmt.frames_key(frames, plan.times)
        ref = fmt.frames_ref(kind, key, plan.times)
        if ref["path"] not in self._refs:
            self._save(ref["path"], frames)
        return ref

    def _save(self, rel: str, frames: np.ndarray) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            np.save(f, frames, allow_pickle=False)
        os.replace(tmp, path)

    def _context(self, p: Pending) -> dict | None:
        if p.context is None:
            return None
        known = self._known.get(p.context_id) if p.context_id else None
        if known is not None and fmt.frames_path("contexts", known[0]) in self._refs:
            self._known.move_to_end(p.context_id)  # type: ignore[arg-type]
            return fmt.frames_ref("contexts", known[0], known[1])
        ref = self._store("contexts", p.context, "context", p.contract, p.limits)
        if p.context_id:
            self._known[p.context_id] = (ref["key"], ref["times"])
            while len(self._known) > 4096:
                self._known.popitem(last=False)
        return ref

    def _write(self, p: Pending) -> None:
        context = self._context(p)
        candidate = self._store("candidates", p.candidate, "candidate", p.contract, p.limits)
        last = self._segments[-1] if self._segments else None  # a segment closes at SEGMENT_ROWS rows or 1/16 of the bound
        seg = last if last is not None and last.rows < SEGMENT_ROWS and last.cost < self.max_bytes // 16 else None
        if seg is None:
            seg = _Segment(self._next)
            self._segments.append(seg)
        seq = seg.seq + seg.rows
        line = json.dumps(fmt.row(seq=seq, time=time.time(), source=p.source, group=p.group, index=p.index, prompt=p.prompt,
                                  context=context, candidate=candidate, reward=p.reward, revision=p.revision,
                                  contract=p.fingerprint or p.contract.fingerprint,
                                  extra={"uncertainty": p.uncertainty} if p.uncertainty is not None else None))
        with open(self.root / fmt.segment_name(seg.seq), "a") as f:
            f.write(line + "\n")
        seg.rows += 1
        seg.bytes += len(line.encode()) + 1
        self.bytes += len(line.encode()) + 1
        self._next = seq + 1
        before = self.bytes
        for ref in (context, candidate):
            if ref is not None:
                self._ref(ref["path"], (self.root / ref["path"]).stat().st_size if ref["path"] not in self._refs else None)
                seg.files.append(ref["path"])
        seg.cost += len(line.encode()) + 1 + self.bytes - before
        self.written += 1
        self._evict()

    def _evict(self) -> None:
        """Drop the oldest segments (and the files only they referenced) until the record fits."""
        while self.bytes > self.max_bytes and self._segments:
            seg = self._segments.popleft()
            (self.root / fmt.segment_name(seg.seq)).unlink(missing_ok=True)
            self.bytes -= seg.bytes
            for rel in seg.files:
                self._refs[rel] -= 1
                if self._refs[rel] == 0:
                    del self._refs[rel]
                    self.bytes -= self._sizes.pop(rel, 0)
                    (self.root / rel).unlink(missing_ok=True)
