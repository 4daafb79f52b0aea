"""One scorer behind every RL reward function: an in-process model or a running ``nvrm serve``.

- ``RewardSource(model_or_url)``: a ``RewardModel``, a bundle path (loaded once per process and
  shared: ``shared_model``), or an ``http(s)://`` URL (``RewardClient``, torch-free).
- ``score(prompts, contexts, candidates)`` groups the items by shared (prompt, context), scores each
  group with prefix reuse, and returns one ``ScoreResult`` or ``NvrmError`` per item, in order. It
  never raises for one bad item and never returns fewer results than items.

Nothing here imports torch at module level: URL mode runs beside any trainer's torch.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

from ..errors import ConfigError, InternalError, NvrmError

def _context_key(prompt: str, context: Any):
    import hashlib

    from ..clip import Clip

    if isinstance(context, (str, os.PathLike)):
        return (prompt, "path", os.path.abspath(os.fspath(context)))
    if isinstance(context, (bytes, bytearray, memoryview)):
        return (prompt, "bytes", hashlib.sha256(bytes(context)).hexdigest())
    if isinstance(context, Clip):
        return (prompt, "obj", id(context))
    return None


def plan_groups(prompts: Sequence[str], contexts: Sequence[Any]) -> list[list[int]]:
    """Indices grouped by identical (prompt, context), first-seen order; unkeyable items alone (pure)."""
    groups: dict[Any, list[int]] = {}
    order: list[list[int]] = []
    for i, (p, c) in enumerate(zip(prompts, contexts)):
        key = _context_key(p, c)
        if key is None:
            order.append([i])
            continue
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(i)
    return order


_MODELS: dict[tuple, Any] = {}
_MODELS_LOCK = threading.Lock()


def is_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def shared_model(path: Any, **load: Any):
    """The ``RewardModel`` for ``path`` and these settings, loaded once per process.

    verl builds its reward manager more than once, and a trainer may build several reward
    functions: they all get the same model (and its weights stay in memory once).
    """
    key = (os.path.abspath(os.fspath(path)) if isinstance(path, (str, os.PathLike)) and os.path.exists(path) else str(path),
           tuple(sorted((k, repr(v)) for k, v in load.items())))
    with _MODELS_LOCK:
        model = _MODELS.get(key)
        if model is None:
            from ..scoring import RewardModel

            model = RewardModel.from_pretrained(path, **load)
            _MODELS[key] = model
        return model


class RewardSource:
    """Scores (prompt, context, candidate) items, grouped by shared (prompt, context)."""

    def __init__(self, model_or_url: Any, *, api_key: str | None = None, short_candidates: bool = False, **load: Any):
        self.client = None
        self.model = None
        if is_url(model_or_url):
            from ..client import RewardClient

            self.client = RewardClient(model_or_url, api_key=api_key, **load)
            if short_candidates:
                raise ConfigError("short_candidates=True: an option of the server's contract in URL mode; start nvrm serve with it")
        elif hasattr(model_or_url, "score_groups"):
            self.model = model_or_url
            if short_candidates and not model_or_url.contract.short_candidates:
                raise ConfigError(
                    "short_candidates=True, but the model given was loaded with the release contract; load it with "
                    "RewardModel.from_pretrained(path, contract=Contract(short_candidates=True)) or pass the bundle path"
                )
        elif model_or_url is None:
            raise ConfigError("no model: pass a RewardModel, a bundle path or the http(s):// URL of nvrm serve")
        else:
            if short_candidates:
                from ..contract import Contract

                load = {**load, "contract": Contract.for_bundle(model_or_url) if os.path.isdir(os.fspath(model_or_url)) else Contract()}
                load["contract"] = _with(load["contract"], short_candidates=True)
            self.model = shared_model(model_or_url, **load)

    @property
    def remote(self) -> bool:
        return self.client is not None

    def score(self, prompts: Sequence[str], contexts: Sequence[Any], candidates: Sequence[Any]) -> tuple[list[Any], list[list[int]]]:
        """(per item: ``ScoreResult`` or ``NvrmError``, the groups used), in input order."""
        if not (len(prompts) == len(contexts) == len(candidates)):
            raise ConfigError(f"prompts, contexts and candidates differ in length ({len(prompts)}, {len(contexts)}, {len(candidates)})")
        plan = plan_groups(prompts, contexts)
        results: list[Any] = [None] * len(prompts)
        groups = [idx for idx in plan if len(idx) > 1]
        singles = [idx[0] for idx in plan if len(idx) == 1]
        # groups stream through the model (the next is prepared while one is scored); singles share batches
        stream = ((prompts[g[0]], contexts[g[0]], [candidates[i] for i in g]) for g in groups)
        outs = self.model.score_groups(stream, errors="return") if self.model is not None else (self._remote_group(*g) for g in stream)
        for idx, out in zip(groups, outs):
            _place(results, idx, out)
        if singles:
            items = [(prompts[i], contexts[i], candidates[i]) for i in singles]
            _place(results, singles, self.model.score_batch(items, errors="return") if self.model is not None else self._remote_batch(items))
        return [r if r is not None else InternalError("internal error: no result for this item") for r in results], plan

    def _remote_group(self, prompt: str, context: Any, candidates: list[Any]) -> list[Any]:
        try:
            return self.client.score_group(prompt, context, candidates, errors="return")  # type: ignore[union-attr]
        except NvrmError as e:  # the request as a whole failed: every slot says why
            return [e] * len(candidates)

    def _remote_batch(self, items: list[Any]) -> list[Any]:
        try:
            return self.client.score_batch(items, errors="return")  # type: ignore[union-attr]
        except NvrmError as e:
            return [e] * len(items)


def _place(results: list[Any], idx: Sequence[int], out: Any) -> None:
    out = list(out)
    for k, i in enumerate(idx):
        results[i] = out[k] if k < len(out) else InternalError(f"internal error: the scorer returned {len(out)} results for {len(idx)} items")


def _with(contract, **changes):
    import dataclasses

    return dataclasses.replace(contract, **changes)


_REGISTRY: dict[Any, Any] = {}
_REGISTRY_LOCK = threading.Lock()


def registry(key: Any, make):
    """One object per key per process (verl scorers: one per distinct ``reward_kwargs``)."""
    with _REGISTRY_LOCK:
        if key not in _REGISTRY:
            _REGISTRY[key] = make()
        return _REGISTRY[key]
