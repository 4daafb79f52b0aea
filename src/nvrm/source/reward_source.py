"""One scorer behind every RL reward function and nvrm's own judge: an in-process model or a running ``nvrm serve``.

- ``RewardSource(model_or_url)``: a ``RewardModel``, a bundle path (loaded once per process and
  shared: ``shared_model``), an ``http(s)://`` URL, or a ``RewardClient`` (both torch-free).
- ``score(prompts, contexts, candidates)`` groups the items by shared (prompt, context), scores each
  group with prefix reuse, and returns one ``ScoreResult`` or ``NvrmError`` per item, in order. It
  never raises for one bad item and never returns fewer results than items.

Nothing here imports torch at module level: URL mode runs beside any trainer's torch. It sits below both
``nvrm.rl`` (the trainers' reward functions) and ``nvrm.prefs`` (``nvrm:``/``nvrm+http`` judges), so neither
imports the other; ``nvrm.rl.scorer`` re-exports its public names.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

from ..errors import ConfigError, InternalError, NvrmError
from .identity import input_key, input_keys
from .pinning import pinned


def context_key(prompt: Any, context: Any) -> tuple:
    """What makes two items one group: the same prompt and the same context (pure).

    The context by ``nvrm.source.identity``'s rule: equal content is one context, whatever object
    carries it (a path by the file it resolves to, bytes, arrays, tensors, images and ``Clip`` frames
    by their bytes); a missing context (the no_context opt-in) is one context per prompt.
    """
    return (_prompt_of(prompt), input_key(context))


def group_items(prompts: Sequence[Any], contexts: Sequence[Any]) -> list[list[int]]:
    """Indices grouped by ``context_key``, in first-seen order (pure).

    The one grouping rule of every RL adapter: a group is scored with one shared prefix, and its
    scored items are what ``on_error="group_mean"`` and ``Normalize(group_whiten=True)`` average.
    The contexts are keyed once for the call (``input_keys``: a copy costs one comparison with the first).
    """
    groups: dict[tuple, list[int]] = {}
    for i, (p, k) in enumerate(zip(prompts, input_keys(contexts))):
        groups.setdefault((_prompt_of(p), k), []).append(i)
    return list(groups.values())


def _prompt_of(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else repr(prompt)


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
            try:
                from ..scoring.reward_model import RewardModel
            except ModuleNotFoundError as e:  # an environment with nvrm-client only
                raise ConfigError(
                    f"model={os.fspath(path)!r}: scoring in process needs nvrm's runtime, and module {e.name!r} is not "
                    "installed here; install the runtime (pip install nvrm), or give the URL of a running nvrm serve "
                    "(nvrm-client is enough for that)"
                ) from e
            model = RewardModel.from_pretrained(path, **load)
            _MODELS[key] = model
        return model


class RewardSource:
    """Scores (prompt, context, candidate) items, grouped by shared (prompt, context)."""

    def __init__(self, model_or_url: Any, *, api_key: str | None = None, short_candidates: bool = False, no_context: bool = False,
                 record: str | os.PathLike | None = None, conservative: float | None = None, **load: Any):
        """``short_candidates`` and ``no_context`` ask for the contract's off-contract opt-ins: a bundle path
        is loaded with them on; a model or a server must already have them (refused otherwise, never ignored).
        ``record``: a folder to keep every scored item in (``nvrm.record``, docs/record.md).
        ``conservative``: λ; the trainer gets ``reward - λ * uncertainty`` (the model, or the served one, needs a guard)."""
        self.recorder = None
        if record is not None:
            from ..record.capture import from_rl

            self.recorder = from_rl(record)
        self.client = None
        self.model = None
        wanted = {name: True for name, on in (("short_candidates", short_candidates), ("no_context", no_context)) if on}
        from ..client import RewardClient

        if is_url(model_or_url) or isinstance(model_or_url, RewardClient):
            from .pinning import client_kwargs

            self.client = model_or_url if isinstance(model_or_url, RewardClient) else RewardClient(model_or_url, api_key=api_key, **client_kwargs(load))
            if wanted:
                served = (self.client.info().get("contract") or {}).get("fields") or {}
                missing = [name for name in wanted if not served.get(name)]
                if missing:
                    raise ConfigError(
                        f"{', '.join(f'{n}=True' for n in missing)}: the server at {self.client.url} scores with the release "
                        f"contract; put {', '.join(repr(n) for n in missing)}: true in its bundle's nvrm_contract.json and restart it"
                    )
        elif hasattr(model_or_url, "score_groups"):
            self.model = model_or_url
            missing = [name for name in wanted if not getattr(model_or_url.contract, name)]
            if missing:
                raise ConfigError(
                    f"{', '.join(f'{n}=True' for n in missing)}, but the model given was loaded without it; load it with "
                    f"RewardModel.from_pretrained(path, contract=Contract({', '.join(f'{n}=True' for n in missing)})) or pass the bundle path"
                )
        elif model_or_url is None:
            raise ConfigError("no model: pass a RewardModel, a bundle path or the http(s):// URL of nvrm serve")
        else:
            if wanted:
                from ..contract import Contract

                base = load.get("contract") or (Contract.for_bundle(model_or_url) if os.path.isdir(os.fspath(model_or_url)) else Contract())
                load = {**load, "contract": _with(base, **wanted)}
            from .pinning import in_process_kwargs

            self.model = shared_model(model_or_url, **in_process_kwargs(load, str(model_or_url)))
        self.conservative = self._conservative(conservative)
        """λ of the conservative reward the adapters hand out, or None (the raw reward)."""

    @property
    def guarded(self) -> bool:
        """Whether its rewards come with an uncertainty (the model, or the served one, has a guard; asked of a server once)."""
        if not hasattr(self, "_guarded"):
            self._guarded = bool(self.client.info().get("guard")) if self.client is not None else getattr(self.model, "guard", None) is not None
        return self._guarded

    def _conservative(self, weight: Any) -> float | None:
        from ..guard.conservative import check_conservative

        if weight is None:
            return None
        if self.client is not None:
            guard = self.client.info().get("guard")
            where = f"conservative={weight!r} (the model at {self.client.url})"
        else:
            guard = getattr(self.model, "guard", None)
            where = f"conservative={weight!r}"
        return check_conservative(weight, guard, where)

    @property
    def remote(self) -> bool:
        return self.client is not None

    def score(
        self, prompts: Sequence[str], contexts: Sequence[Any], candidates: Sequence[Any], groups: Sequence[Sequence[int]] | None = None
    ) -> tuple[list[Any], list[list[int]]]:
        """(per item: ``ScoreResult`` or ``NvrmError``, the groups used), in input order.

        ``groups``: the call's ``group_items`` when the caller has it already (the contexts are keyed once per call)."""
        if not (len(prompts) == len(contexts) == len(candidates)):
            raise ConfigError(f"prompts, contexts and candidates differ in length ({len(prompts)}, {len(contexts)}, {len(candidates)})")
        plan = [list(g) for g in groups] if groups is not None else group_items(prompts, contexts)
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
        results = [r if r is not None else InternalError("internal error: no result for this item") for r in results]
        if self.recorder is not None:
            from ..record.capture import offer_rl

            offer_rl(self.recorder, self.model, prompts, contexts, candidates, results, plan)
        return results, plan

    def _remote_group(self, prompt: str, context: Any, candidates: list[Any]) -> list[Any]:
        try:
            return self.client.score_group(prompt, context, candidates, errors="return")  # type: ignore[union-attr]
        except NvrmError as e:  # the request as a whole failed: every slot says why (a pinned revision refused: raised)
            return [pinned(e)] * len(candidates)

    def _remote_batch(self, items: list[Any]) -> list[Any]:
        try:
            return self.client.score_batch(items, errors="return")  # type: ignore[union-attr]
        except NvrmError as e:
            return [pinned(e)] * len(items)


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
