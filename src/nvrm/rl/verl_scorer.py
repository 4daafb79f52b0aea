"""The machinery behind ``nvrm.rl.verl``: settings from ``reward_kwargs``, per-sample batching, one
scorer per distinct settings per process. (``nvrm/rl/verl.py`` itself is loaded by verl *by file path*,
outside the package, so it holds only the functions verl looks up.)"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from ..errors import ConfigError, RewardFnError
from .calls import check_items, completion_as_path, guard_columns, off_contract, refuse_unknown, score_call
from ..source.pinning import distinct, revisions_of
from .policy import FailurePolicy, SignalMonitor
from .render import render_all, resolve, row_of
from ..source.reward_source import RewardSource, registry

VERL_EXTRAS = {"reward_router_address", "reward_model_tokenizer"}
"""Keyword arguments verl itself adds to a call; not settings, so not used."""

LOAD_KEYS = {"device", "dtype", "verify", "max_batch_tokens", "workers", "worker_kind", "attention", "revision", "timeout", "retries",
             "conservative"}
"""Keyword arguments that are how the model loads or is reached (``RewardModel.from_pretrained`` / ``RewardClient``), shared
with the verl-omni adapter."""


@dataclasses.dataclass(frozen=True)
class VerlSettings:
    """What ``reward_kwargs`` may hold."""

    model: Any
    """The URL of nvrm serve, a bundle path, or (from Python) a RewardModel."""
    context_key: str = "context_video"
    prompt_key: str = "prompt"
    candidate_key: str | None = None
    render: Any = None
    on_error: Any = "raise"
    short_candidates: bool = False
    no_context: bool = False
    coalesce_ms: float = 20.0
    api_key: str | None = None
    model_name: str | None = None
    """The served model's name (``GET /v1/models``; URL mode); ``revision`` pins its revision (``nvrm.source.pinning``)."""
    load: tuple = ()

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "VerlSettings":
        names = {f.name for f in dataclasses.fields(cls)} - {"load"}
        refuse_unknown(kwargs, names | LOAD_KEYS | VERL_EXTRAS, "verl reward_kwargs")
        if "model" not in kwargs:
            raise ConfigError("verl reward_kwargs: no 'model'; give the URL of nvrm serve (or a bundle path to load in process)")
        given = {k: v for k, v in kwargs.items() if k in names}
        load = tuple(sorted((k, v) for k, v in kwargs.items() if k in LOAD_KEYS))
        return cls(**given, load=load)


class Batcher:
    """Per-sample calls that arrive together, scored as one batch (the first caller waits ``window`` s)."""

    def __init__(self, run, window: float):
        self.run = run
        self.window = window
        self.lock = threading.Lock()
        self.pending: list[tuple[tuple, Future]] = []
        self.leader = False

    def submit(self, item: tuple) -> Any:
        fut: Future = Future()
        with self.lock:
            self.pending.append((item, fut))
            lead = not self.leader
            self.leader = True
        if lead:
            time.sleep(self.window)
            with self.lock:
                batch, self.pending, self.leader = self.pending, [], False
            try:
                outs = self.run([it for it, _ in batch])
            except BaseException as e:  # noqa: BLE001 - every waiting caller learns why
                outs = [e] * len(batch)
            for (_, f), out in zip(batch, outs):
                f.set_result(out)
        out = fut.result()
        if isinstance(out, BaseException):
            raise out
        return out


class VerlScorer:
    def __init__(self, settings: VerlSettings):
        self.settings = settings
        self.policy = FailurePolicy.parse(settings.on_error, ("raise", "group_mean"), where="verl reward_kwargs on_error")
        self.render = resolve(settings.render, "verl reward_kwargs render")
        if self.render is not None and settings.candidate_key is not None:
            raise ConfigError("verl reward_kwargs: render and candidate_key both given; the candidate comes from one of them")
        load = {**dict(settings.load), **({"model": settings.model_name} if settings.model_name is not None else {})}
        self.source = RewardSource(settings.model, api_key=settings.api_key, short_candidates=settings.short_candidates, no_context=settings.no_context, **load)
        self.monitor = SignalMonitor("nvrm verl reward", "Make the candidate from solution_str: reward_kwargs.render=module:function.")
        self.batcher = Batcher(self._outcomes, settings.coalesce_ms / 1000.0)
        self._failed: OrderedDict[str, RewardFnError] = OrderedDict()
        self._lock = threading.Lock()

    def _call(self, items: list[tuple]):
        s = self.settings
        infos = [info if isinstance(info, dict) else {} for _, _, _, info in items]
        prompts = [info.get(s.prompt_key) for info in infos]
        contexts = [info.get(s.context_key) for info in infos]
        solutions = [solution for _, solution, _, _ in items]
        if self.render is not None:
            cands = render_all(self.render, prompts, solutions, [row_of(info) for info in infos])
        elif s.candidate_key is not None:
            cands = [info.get(s.candidate_key) for info in infos]
        else:
            cands = [completion_as_path(solution, i) for i, solution in enumerate(solutions)]
        return check_items(prompts, contexts, cands, prompt_name=f"extra_info[{s.prompt_key!r}]", context_name=f"extra_info[{s.context_key!r}]",
                           no_context=s.no_context)

    def _outcomes(self, items: list[tuple]) -> list[Any]:
        """One dict or one error per item (the per-sample path: a failure fails only its caller)."""
        call = self._call(items)
        rewards, groups, errors, results = score_call(self.source, call, policy=FailurePolicy("none"), normalize=None, monitor=self.monitor)
        if errors and self.policy.mode != "raise":
            rewards = self.policy.apply(rewards, groups, errors)
        flags = off_contract(results)
        revisions = revisions_of(results)  # verl's reward_extra_info: which revision scored each sample
        distinct(revisions, "nvrm verl reward")
        both = guard_columns(self.source, results)
        return [
            RewardFnError({i: errors[i]}, len(items)) if r is None
            else {"score": float(r), "nvrm_ok": 0.0 if i in errors else 1.0, "nvrm_off_contract": 1.0 if flags[i] else 0.0,
                  "nvrm_revision": revisions[i] or "", **{k: v[i] for k, v in both.items()}}
            for i, r in enumerate(rewards)
        ]

    def batch(self, items: list[tuple]) -> list[dict]:
        key = _digest(items)
        with self._lock:
            seen = self._failed.get(key)
        if seen is not None:  # verl called again after our error: the same answer, not a second scoring
            raise seen
        outs = self._outcomes(items)
        failures = {i: next(iter(o.failures.values())) for i, o in enumerate(outs) if isinstance(o, RewardFnError)}
        if failures:
            err = RewardFnError(failures, len(items))
            with self._lock:
                self._failed[key] = err
                while len(self._failed) > 16:
                    self._failed.popitem(last=False)
            raise err
        return outs  # type: ignore[return-value]

    def single(self, item: tuple) -> dict:
        return self.batcher.submit(item)


def _digest(items: list[tuple]) -> str:
    return hashlib.sha256(repr(items).encode("utf-8", "replace")).hexdigest()


def scorer_for(kwargs: dict) -> VerlScorer:
    settings = VerlSettings.from_kwargs(kwargs)
    return registry(("verl", repr(settings)), lambda: VerlScorer(settings))


