"""One writer per record folder: ``record.lock``, held with an exclusive ``flock`` while a writer writes the folder.

Two writers on one folder would reuse each other's sequence numbers and each bound only its own bytes, so the
second (in this process or another) is refused at once with a one-line ``InputError`` naming the holder. The
lock goes with the writer's ``close`` or its process; the empty file stays.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from ..errors import InputError

LOCK = "record.lock"
"""The (empty) file a writer holds an exclusive ``flock`` on."""
_HELD: set[str] = set()
"""Folders a writer of this process holds."""


def claim(root: Path) -> IO[str] | None:
    """The open, locked ``root/record.lock``; an ``InputError`` naming the holder when another writer has it. None when
    the folder cannot be made: the writer then stops recording with its one warning, as for any write error."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fh = open(root / LOCK, "a")
    except OSError:
        return None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        from ..batch.journal import lock_holder

        holder = f"this process (pid {os.getpid()})" if str(root.resolve()) in _HELD else lock_holder(root / LOCK)
        raise InputError(str(root), f"this record folder is being written by {holder}; one writer per folder: give each writer a folder of its own") from None
    _HELD.add(str(root.resolve()))
    return fh


def release(root: Path, fh: IO[str] | None) -> None:
    """Let another writer have ``root`` (the lock ``claim`` returned)."""
    if fh is not None:
        _HELD.discard(str(root.resolve()))
        fh.close()
