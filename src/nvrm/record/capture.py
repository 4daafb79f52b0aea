"""What the scorers hand the record: ``Recorder.offer`` turns one request's scored items into queued rows.

The one entry point of ``nvrm serve --record`` (``from_serve``) and of the RL adapters' ``record=DIR``
(``from_rl``). It only groups, samples and queues (cheap); the writer thread does the rest, so the
request that was scored never waits for the record.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any, Sequence

from . import format as fmt
from .writer import Pending, RecordWriter


def _nbytes(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    frames = getattr(value, "frames", None)
    if isinstance(frames, (tuple, list)):
        return sum(int(getattr(f, "nbytes", 0)) for f in frames)
    return int(getattr(value, "nbytes", 0) or 0)


def _scored(result: Any) -> bool:
    return not isinstance(result, BaseException) and isinstance(getattr(result, "reward", None), float)


class Recorder:
    """Queues scored items into a record at ``root`` (``rate``: the share of groups kept, deterministic for ``seed``)."""

    def __init__(self, root: str | os.PathLike, *, max_mb: float = 1024.0, rate: float = 1.0, seed: int = 0, source: str = "serve"):
        self.writer = RecordWriter(root, int(max_mb * 1024 * 1024))
        self.rate, self.seed, self.source = rate, seed, source
        self.run = f"{int(time.time()):x}{os.getpid():x}"
        self._requests = itertools.count()
        self._lock = threading.Lock()

    def offer(self, items: Sequence[tuple[str, Any, str | None, Any]], results: Sequence[Any], *, contract: Any, limits: Any,
              revision: str | None, groups: Sequence[int] | None = None) -> int:
        """Queue one request's scored items ``(prompt, context, context id, candidate)``; returns how many were queued.

        ``groups``: each item's group number within the request (default: by prompt and context id). Never raises."""
        try:
            with self._lock:
                n = next(self._requests)
            pending, index = [], {}
            for k, ((prompt, context, cid, candidate), result) in enumerate(zip(items, results)):
                if not _scored(result):
                    continue
                local = fmt.group_key(self.source, n, prompt, cid if groups is None else str(groups[k]))
                if not fmt.sampled(self.rate, self.seed, local):
                    continue
                index[local] = index.get(local, -1) + 1
                pending.append(Pending(
                    prompt, context, f"{self.run}.{cid}" if cid else f"{self.run}.{n}.{local}", candidate, result.reward,
                    result.model_revision or revision or "unversioned", contract, limits, f"{self.run}.{local}", index[local], self.source,
                    _nbytes(context) * (index[local] == 0) + _nbytes(candidate), str(getattr(result, "contract", "") or ""),
                    getattr(result, "uncertainty", None),
                ))
            return len(pending) if pending and self.writer.submit(pending) else 0
        except Exception:  # the record must never fail a score
            return 0

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and stop."""
        self.writer.close(timeout)


def from_serve(config: Any) -> Recorder | None:
    """The recorder ``nvrm serve --record DIR`` asks for (None: not recording)."""
    root = getattr(config, "record", None)
    if not root:
        return None
    return Recorder(root, max_mb=config.record_mb, rate=config.record_rate, seed=config.record_seed, source="serve")


def offer_work(recorder: Recorder | None, work: Any, results: Sequence[Any], model: Any) -> None:
    """Record a served request (``nvrm.serve.admission.requests.Work``) and its results; a no-op without ``--record``."""
    if recorder is None:
        return
    try:
        if work.items is not None:
            items = [(p, c.value, c.key or None, d.value) for p, c, d in work.items]
        else:
            prompt, ctx, cands = work.group
            items = [(prompt, ctx.value, ctx.key or None, d.value) for d in cands]
        recorder.offer(items, results, contract=model.contract, limits=model.limits, revision=getattr(model, "revision", None))
    except Exception:  # the record must never fail a score
        return


_RL: dict[tuple, Recorder] = {}
_RL_LOCK = threading.Lock()


def from_rl(root: str | os.PathLike | None, **settings: Any) -> Recorder | None:
    """One recorder per record folder per process (every RL reward function writing to ``root`` shares it)."""
    if not root:
        return None
    key = (os.path.abspath(os.fspath(root)),)
    with _RL_LOCK:
        if key not in _RL:
            _RL[key] = Recorder(root, source="rl", **settings)
        return _RL[key]


def offer_rl(recorder: Recorder | None, model: Any, prompts: Sequence[Any], contexts: Sequence[Any], candidates: Sequence[Any],
             results: Sequence[Any], plan: Sequence[Sequence[int]]) -> None:
    """Record one RL scoring call (groups as ``nvrm.source.reward_source`` made them); a no-op without ``record=``."""
    if recorder is None:
        return
    from ..clip import Clip
    from ..contract import Contract
    from ..video.inputs import presample

    contract = getattr(model, "contract", None) or Contract()
    limits = getattr(model, "limits", None)
    group = [0] * len(prompts)
    for g, idx in enumerate(plan):
        for i in idx:
            group[i] = g

    def own(value: Any, role: str) -> Any:  # a clip (a GPU tensor, a reused buffer) is copied now: only its sampled frames
        try:
            return presample(value, role, contract, limits) if isinstance(value, Clip) else value
        except Exception:
            return value

    try:
        items = [(p if isinstance(p, str) else repr(p), own(c, "context"), None, own(d, "candidate"))
                 for p, c, d in zip(prompts, contexts, candidates)]
        recorder.offer(items, results, contract=contract, limits=limits, revision=getattr(model, "revision", None), groups=group)
    except Exception:  # the record must never fail a score
        return
