"""Giving freed memory back to the system, so an idle server returns to its stated bound.

glibc keeps what Python, NumPy, PIL and torch free: each thread that allocates gets an arena of its
own (up to 8 per core), freed chunks inside an arena's heap stay resident until the heap's top is
free, and after a large buffer is freed the mmap threshold rises to its size, so the next bodies and
frame copies of that size come from the heaps too and fragment them. Under load that is gigabytes the
byte budget never sees, and an address-space cap then fails allocations the budget admitted.

``tune()`` (once, at start) fixes the mmap threshold at 8 MiB, so request bodies and frame copies of
that size or more are mapped and unmapped (address space and pages return on free) from the first
request on, and caps the arenas. The threshold is a trade: on this project's 2-core CPU machine
(tests/hostile/test_memory_returned.py's load) the resident peak above idle was 836 MB with glibc's
defaults, 733 MB at 16 MiB, 610 MB at 8 MiB and 616 MB at 1 MiB, while a CPU forward pass, whose
activations are then mapped too, ran about 1.1 times slower at 8 MiB and 1.4 times at 1 MiB (the mid
bundle's ``score_batch``). On a GPU the activations live on the device and the cost does not arise.
``NVRM_MALLOC_TUNE=0`` keeps glibc's defaults. ``Trimmer`` runs
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

MMAP_THRESHOLD = 8 << 20
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
    """Set glibc's allocator for a long-running server (call before the model loads); False off glibc
    or with ``NVRM_MALLOC_TUNE=0``."""
    import os

    lib = _libc()
    if lib is None or os.environ.get("NVRM_MALLOC_TUNE", "1") == "0":
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
