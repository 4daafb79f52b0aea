"""Giving freed memory back to the system, so an idle server returns to its stated bound.

glibc keeps what Python, NumPy, PIL and torch free: each thread that allocates gets an arena of its
own (up to 8 per core), freed chunks inside an arena's heap stay resident until the heap's top is
free, and after a large buffer is freed the mmap threshold rises to its size, so the next bodies and
frame copies of that size come from the heaps too and fragment them. Under load that is gigabytes the
byte budget never sees, and an address-space cap then fails allocations the budget admitted.

``tune()`` (once, at start) fixes the mmap threshold at glibc's own ceiling, 32 MiB, so the bodies and
frame copies above it are mapped and unmapped (address space and pages return on free) from the
first request on, and caps the arenas. (A lower threshold returns a little more but maps every
activation of a CPU forward pass: at 1 MiB the mid bundle's ``score_batch`` ran 1.4 times slower
here, at 8 MiB about 1.1 times; at 32 MiB it runs as fast as with glibc's defaults.) ``Trimmer`` runs
``malloc_trim(0)`` once the requests in flight have all been answered (at most once per interval),
which returns the free pages inside every arena. Both are no-ops off glibc.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

MMAP_THRESHOLD = 32 << 20
"""Buffers of at least this many bytes are mapped on their own (large bodies and frame copies)."""
ARENAS = 4
"""Most malloc arenas: the event loop, parse threads, preparation workers and the scorer share them."""


def _libc():
    try:
        lib = ctypes.CDLL(None)
        lib.malloc_trim, lib.mallopt  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return lib


def tune(arenas: int = ARENAS, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's allocator for a long-running server (call before the model loads); False off glibc."""
    lib = _libc()
    if lib is None:
        return False
    ok = lib.mallopt(M_ARENA_MAX, arenas) == 1
    ok = lib.mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and ok  # fixed: no dynamic rise
    ok = lib.mallopt(M_TRIM_THRESHOLD, 4 * mmap_threshold) == 1 and ok
    return ok


class Trimmer:
    """Calls ``malloc_trim(0)`` on its own thread once ``idle()`` is true after ``touch()``, at most
    once per ``interval_s``."""

    def __init__(self, idle, interval_s: float = 1.0):
        self._lib = _libc()
        self._idle = idle
        self._interval = interval_s
        self._dirty = threading.Event()
        self.trims = 0
        if self._lib is not None:
            threading.Thread(target=self._loop, name="nvrm-trim", daemon=True).start()

    def touch(self) -> None:
        """Something was released: trim once the server is idle."""
        self._dirty.set()

    def _loop(self) -> None:
        while True:
            self._dirty.wait()
            time.sleep(self._interval)  # let the answered requests' frames and bodies go first
            if not self._idle():
                continue  # still busy: the next release touches again
            self._dirty.clear()
            try:
                self._lib.malloc_trim(0)
                self.trims += 1
            except Exception:  # noqa: BLE001 - never let the janitor take the server down
                log.debug("malloc_trim failed", exc_info=True)
