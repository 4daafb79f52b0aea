"""An append-only JSONL journal that one process at a time may write: batch outputs and judgment files.

The journal is opened, then locked (``flock``, exclusive, not waiting) before anything is read or
cut, so a second run on the same output is refused with a one-line error naming the process that
holds it instead of appending a second copy of every row. Every append is whole lines in one
``write``, then ``flush`` and ``fsync``; a run killed mid-write leaves at most one torn last line,
which the next run cuts off (under the lock) before it reads the rows.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import InputError, OutputError

log = logging.getLogger(__name__)


def fsync_dir(path: Path) -> None:
    """Make a new or renamed entry of ``path`` durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def lock_holder(path: Path) -> str:
    """Who holds the flock on ``path``, from /proc/locks (Linux): 'pid N (command)', or 'another process'."""
    try:
        st = path.stat()
        wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4] != str(os.getpid()):
                pid = fields[4]
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    cmd = ""
                return f"pid {pid}" + (f" ({cmd[:120]})" if cmd else "")
    except (OSError, ValueError):
        pass
    return "another process"


class Journal:
    """An exclusively locked JSONL file opened for appending."""

    def __init__(self, path: str | Path, *, what: str = "output"):
        self.path = Path(path)
        self.created = not self.path.exists()
        try:
            self._fh = self.path.open("a+b")
        except OSError as e:
            raise OutputError(str(self.path), e.strerror or type(e).__name__) from e
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise InputError(str(self.path), f"this {what} is being written by {lock_holder(self.path)}; wait for that run to end or write elsewhere") from None
        if self.created:
            fsync_dir(self.path.parent)

    def rows(self, check: Callable[[int, Any], str | None] | None = None) -> list[dict[str, Any]]:
        """The journal's rows, cutting off a torn last line in place; ``check(line, row)`` names a row that is not one of ours."""
        self._fh.seek(0)
        data = self._fh.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            log.warning("%s: cutting a torn last line (%d bytes) left by an interrupted run", self.path, len(data) - end)
            self._fh.truncate(end)
            self._sync()
        out = []
        for n, line in enumerate(data[:end].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(str(self.path), f"line {n} is not valid JSON ({e.msg}); this file was not written by nvrm") from e
            except RecursionError as e:
                raise InputError(str(self.path), f"line {n} is nested too deeply to read; this file was not written by nvrm") from e
            problem = check(n, row) if check else (None if isinstance(row, dict) else "not a JSON object")
            if problem:
                raise InputError(str(self.path), f"line {n} {problem}")
            out.append(row)
        return out

    def replace(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rewrite the journal to hold exactly ``rows`` (under the lock)."""
        self._fh.truncate(0)
        self.append(rows)

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        blob = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
        if not blob:
            return
        try:
            self._fh.write(blob.encode("utf-8"))
            self._sync()
        except OSError as e:  # a torn last line is cut by the next run; the rows before it stay
            raise OutputError(str(self.path), e.strerror or type(e).__name__) from e

    def _sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def close(self) -> None:
        """Release the lock and close (errors already reported by the write that failed are not raised again)."""
        if not self._fh.closed:
            try:
                self._fh.close()
            except OSError:
                pass

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
