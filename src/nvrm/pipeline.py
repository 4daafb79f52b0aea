"""A worker pool for the CPU side: decoding, the per-frame contract and encoding.

PyAV decoding, Pillow's resize / JPEG codec and torch's patch normalisation
release the GIL, so plain threads run them in parallel and alongside the
model's forward passes. The fast tokenizer is not safe to share across
threads, so every worker tokenises with its own processor copy
(``RewardModel._processor``).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """One worker per core the process may use, at most 16."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(16, n))


class PrepPool:
    """Runs preprocessing jobs ahead of the model; ``workers=0`` runs them inline."""

    def __init__(self, workers: int | None = None):
        self.workers = default_workers() if workers is None else workers
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="nvrm-prep") if self.workers > 0 else None

    def submit(self, fn: Callable[..., R], *args) -> "Future[R]":
        if self._executor is None:
            f: Future = Future()
            try:
                f.set_result(fn(*args))
            except BaseException as e:  # delivered when the caller asks for the result
                f.set_exception(e)
            return f
        return self._executor.submit(fn, *args)

    def map_ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> list["Future[R]"]:
        """Submit everything now; the caller consumes the futures in order."""
        return [self.submit(fn, item) for item in items]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
