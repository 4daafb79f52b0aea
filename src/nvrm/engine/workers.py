"""Where the engine's jobs run: worker threads or worker processes.

Measured (BENCHMARKS.md, "Preprocessing engine"): the per-frame contract
holds the GIL for about a seventh of its time and encoding for about a
quarter, so threads stop scaling past a handful of workers while processes
keep scaling; on a 2-core machine both reach about 1.9x with 2 workers.
``kind="auto"`` therefore uses threads for up to four workers and processes
beyond. Every worker has its own processor (the fast tokenizer must not be
shared between threads): a deep copy per thread, an unpickled copy per process.

A worker process that dies (a decoder crash on a hostile file, the OOM
killer) breaks the pool: it is restarted and the jobs it took down are run
once more; a job that kills a worker twice gets an ``InternalError`` in its
slot, and nothing else is lost.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import multiprocessing as mp
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np
import torch

from ..contract import Contract
from ..errors import InternalError, NvrmError
from ..limits import Limits
from .codec import PixelCodec
from .encode import RopeSpec

log = logging.getLogger(__name__)

WorkerKind = Literal["auto", "thread", "process"]
THREADS_UP_TO = 4
"""``kind="auto"`` uses threads up to this many workers, processes beyond."""


def default_workers() -> int:
    """One worker per core the process may use, at most 16."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(16, n))


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs; pickled once into each worker process."""

    processor: Any
    contract: Contract
    codec: PixelCodec | None
    rope: RopeSpec
    limits: Limits


class WorkerState:
    """One worker's own copy of the processor, plus the shared read-only spec."""

    def __init__(self, spec: WorkerSpec, processor: Any):
        self.spec = spec
        self.processor = processor
        self.contract = spec.contract
        self.codec = spec.codec
        self.rope = spec.rope
        self.limits = spec.limits


_PROCESS_STATE: WorkerState | None = None


def _init_process(spec: WorkerSpec) -> None:
    global _PROCESS_STATE
    import torch

    torch.set_num_threads(1)  # one core per worker; the model's threads live in the parent
    _PROCESS_STATE = WorkerState(spec, spec.processor)


def _run_in_process(fn: Callable[..., Any], args: tuple) -> Any:

    assert _PROCESS_STATE is not None, "worker process was not initialised"
    return to_numpy(fn(_PROCESS_STATE, *args))


class Workers:
    """Runs ``fn(state, *args)`` jobs on threads, processes, or inline (``workers=0``)."""

    def __init__(self, spec: WorkerSpec, workers: int | None = None, kind: WorkerKind = "auto"):
        n = default_workers() if workers is None else int(workers)
        if n < 0:
            raise ValueError(f"workers must be >= 0, got {n}")
        if kind not in ("auto", "thread", "process"):
            raise ValueError(f"kind must be 'auto', 'thread' or 'process', got {kind!r}")
        if kind == "auto":
            kind = "thread" if n <= THREADS_UP_TO else "process"
        self.spec = spec
        self.workers = n
        self.kind: str = "inline" if n == 0 else kind
        self._template = copy.deepcopy(spec.processor)
        self._template_lock = threading.Lock()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._generation = 0
        self._closed = False
        self._pool: ThreadPoolExecutor | ProcessPoolExecutor | None = None
        if self.kind == "thread":
            self._pool = ThreadPoolExecutor(n, thread_name_prefix="nvrm-prep")
        elif self.kind == "process":
            self._pool = self._new_process_pool()

    # ------------------------------------------------------------ state

    def local_state(self) -> WorkerState:
        """This thread's worker state (its own processor copy)."""
        state = getattr(self._local, "state", None)
        if state is None:
            with self._template_lock:
                processor = copy.deepcopy(self._template)
            state = self._local.state = WorkerState(self.spec, processor)
        return state

    def _new_process_pool(self) -> ProcessPoolExecutor:
        # forkserver: children start from a clean, single-threaded server, never
        # from a fork of this (threaded) process
        ctx = mp.get_context("forkserver")
        return ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init_process, initargs=(self.spec,))

    # ------------------------------------------------------------ jobs

    def run_inline(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a job on the calling thread, with this thread's state."""
        return fn(self.local_state(), *args)

    def submit(self, fn: Callable[..., Any], *args: Any) -> "Future[Any]":
        """Run ``fn(state, *args)`` on a worker; ``fn`` must be a module-level function."""
        if self._closed:
            raise RuntimeError("the preprocessing engine is closed")
        if self.kind == "inline":
            f: Future = Future()
            try:
                f.set_result(self.run_inline(fn, *args))
            except BaseException as e:  # noqa: BLE001 - delivered when the caller asks
                f.set_exception(e)
            return f
        if self.kind == "thread":
            return self._pool.submit(self.run_inline, fn, *args)  # type: ignore[union-attr]
        out: Future = Future()
        self._submit_process(out, fn, args, retries=1)
        return out

    def _submit_process(self, out: Future, fn, args: tuple, retries: int) -> None:
        with self._lock:
            generation, pool = self._generation, self._pool
        try:
            inner = pool.submit(_run_in_process, fn, args)  # type: ignore[union-attr]
        except (BrokenProcessPool, RuntimeError) as e:
            if self._closed:
                out.set_exception(RuntimeError("the preprocessing engine is closed"))
                return
            inner = Future()
            inner.set_exception(BrokenProcessPool(str(e)))

        def done(f: Future) -> None:
            if out.cancelled():
                return
            if f.cancelled():
                out.cancel()
                return
            e = f.exception()
            if isinstance(e, BrokenProcessPool) and not self._closed:
                self._restart(generation)
                if retries > 0:
                    self._submit_process(out, fn, args, retries - 1)
                else:
                    out.set_exception(
                        InternalError("internal error: a worker process died while preparing this input (twice)")
                    )
                return
            if e is not None:
                out.set_exception(e)
            else:

                out.set_result(to_torch(f.result()))

        inner.add_done_callback(done)

    def _restart(self, generation: int) -> None:
        with self._lock:
            if generation != self._generation or self._closed:
                return  # someone already restarted this pool
            log.warning("a preprocessing worker process died; restarting the pool")
            old = self._pool
            self._pool = self._new_process_pool()
            self._generation += 1
        if old is not None:
            old.shutdown(wait=False, cancel_futures=False)

    def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def unexpected(e: BaseException) -> NvrmError:
    """An error as it goes into a result slot: expected ones as they are, others wrapped."""
    if isinstance(e, NvrmError):
        return e
    log.warning("unexpected error while preparing an input", exc_info=e)
    return InternalError.wrap(e)


# ---------------------------------------------------------------- process boundary


def to_numpy(obj: Any) -> Any:
    """Tensors inside a job result -> NumPy arrays (pickled as plain bytes between processes)."""
    return _map(obj, lambda t: t.numpy() if isinstance(t, torch.Tensor) else t)


def to_torch(obj: Any) -> Any:
    """The inverse of ``to_numpy`` (zero-copy)."""
    return _map(obj, lambda t: torch.from_numpy(t) if isinstance(t, np.ndarray) else t)


def _map(obj: Any, fn) -> Any:
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, (torch.Tensor, np.ndarray)) or dataclasses.is_dataclass(value):
                changes[f.name] = _map(value, fn)
            elif isinstance(value, list) and value and isinstance(value[0], (torch.Tensor, np.ndarray)):
                changes[f.name] = [fn(v) for v in value]
        return dataclasses.replace(obj, **changes) if changes else obj
    return obj
