"""What an RL adapter does with failed items, how it shapes rewards, and when it warns about zero signal.

Pure bookkeeping over lists of rewards (``None`` = the item could not be scored); no model, no I/O.

Failure policies (``on_error``):

- ``"raise"``: raise ``RewardFnError`` naming every failed index (verl, flow-GRPO, ``make_reward_fn``);
- ``"none"``: leave ``None`` in the slot (TRL: "reward not applicable", left out of the sum);
- ``"group_mean"``: the mean of the scored items of the failed item's group, so its advantage is 0
  under per-group normalisation and one failure never turns a group's advantages into NaN
  (flow-GRPO); a group with no scored item gets the mean of the call's scored items;
- ``"nan"``: NaN, only when asked for by name;
- a finite number: that number.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import ConfigError, RewardFnError, ZeroSignalWarning
from ..source.identity import all_same, input_key  # noqa: F401 - input_key: its name here before the one rule

log = logging.getLogger("nvrm")

POLICIES = ("raise", "none", "group_mean", "nan")


@dataclass(frozen=True)
class FailurePolicy:
    """A validated ``on_error`` setting."""

    mode: str
    value: float | None = None

    @classmethod
    def parse(cls, on_error: Any, allowed: Sequence[str] = POLICIES, where: str = "on_error") -> "FailurePolicy":
        """``on_error`` as given by a user or a trainer's config; refused with a one-line error otherwise."""
        if isinstance(on_error, str):
            if on_error in allowed:
                return cls(on_error)
            try:  # a number that arrived as text from a YAML / CLI config
                on_error = float(on_error)
            except ValueError:
                raise ConfigError(f"{where}={on_error!r}: must be one of {', '.join(map(repr, allowed))} or a finite number") from None
        if isinstance(on_error, bool) or not isinstance(on_error, (int, float)):
            raise ConfigError(f"{where}={on_error!r}: must be one of {', '.join(map(repr, allowed))} or a finite number")
        if not math.isfinite(on_error):
            hint = " (ask for NaN by name: on_error='nan')" if "nan" in allowed else ""
            raise ConfigError(f"{where}={on_error!r}: a fill value must be finite{hint}")
        return cls("value", float(on_error))

    def apply(self, rewards: Sequence[float | None], groups: Sequence[Sequence[int]], errors: dict[int, str]) -> list[Any]:
        """Rewards with failed slots handled; raises ``RewardFnError`` for ``"raise"``."""
        out: list[Any] = list(rewards)
        failed = [i for i, r in enumerate(out) if r is None]
        if not failed:
            return out
        if self.mode == "raise":
            raise RewardFnError({i: errors.get(i, "not scored") for i in failed}, len(out))
        if self.mode == "none":
            return out
        if self.mode == "nan":
            return [math.nan if r is None else r for r in out]
        if self.mode == "value":
            return [self.value if r is None else r for r in out]
        scored = [r for r in out if r is not None]
        if not scored:
            raise RewardFnError({i: errors.get(i, "not scored") for i in failed}, len(out))
        overall = sum(scored) / len(scored)
        for idx in groups:
            vals = [out[i] for i in idx if out[i] is not None]
            fill = sum(vals) / len(vals) if vals else overall
            for i in idx:
                if out[i] is None:
                    out[i] = fill
        return out


@dataclass
class RunningStats:
    """Mean and variance over everything seen (Welford), safe to share between threads."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def update(self, values: Sequence[float]) -> None:
        with self._lock:
            for v in values:
                self.n += 1
                d = v - self.mean
                self.mean += d / self.n
                self.m2 += d * (v - self.mean)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n > 1 else 0.0


@dataclass(frozen=True)
class Normalize:
    """Optional reward shaping for RL; the default changes nothing."""

    group_whiten: bool = False
    """z-score within each group of shared (prompt, context): (r - mean) / (std + eps)."""
    running: bool = False
    """z-score by the running mean and std of every reward seen so far (applied before clipping)."""
    clip: float | None = None
    """Clip the (shaped) reward to [-clip, clip]; must be a finite number > 0."""
    eps: float = 1e-6
    """Added to the std; must be a finite number > 0."""
    stats: RunningStats = field(default_factory=RunningStats, compare=False)

    def __post_init__(self) -> None:
        if self.clip is not None and (isinstance(self.clip, bool) or not isinstance(self.clip, (int, float)) or not math.isfinite(self.clip) or self.clip <= 0):
            raise ConfigError(f"Normalize(clip={self.clip!r}): must be a finite number > 0, or None for no clipping")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps) or self.eps <= 0:
            raise ConfigError(f"Normalize(eps={self.eps!r}): must be a finite number > 0")

    @property
    def active(self) -> bool:
        return self.group_whiten or self.running or self.clip is not None

    def __call__(self, rewards: list[float | None], groups: Sequence[Sequence[int]]) -> list[float | None]:
        """Shaped rewards; ``None`` (failed) entries stay ``None``."""
        out = list(rewards)
        if self.group_whiten:
            for idx in groups:
                vals = [out[i] for i in idx if out[i] is not None]
                if len(vals) < 2:
                    continue
                mean = sum(vals) / len(vals)
                std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
                for i in idx:
                    if out[i] is not None:
                        out[i] = (out[i] - mean) / (std + self.eps)  # type: ignore[operator]
        if self.running:
            good = [v for v in out if v is not None]
            self.stats.update(good)
            out = [None if v is None else (v - self.stats.mean) / (self.stats.std + self.eps) for v in out]
        if self.clip is not None:
            c = float(self.clip)
            out = [None if v is None else max(-c, min(c, v)) for v in out]
        return out


class SignalMonitor:
    """Warns once per run (per adapter) when a step can carry no learning signal.

    Two causes are checked on every call: every candidate of a group is the same input (the reward
    does not follow what the policy wrote), and every reward of the call is equal.
    """

    def __init__(self, name: str, hint: str):
        self.name = name
        self.hint = hint
        self._warned: set[str] = set()
        self._reasons: set[str] = set()
        self._lock = threading.Lock()

    def failures(self, errors: dict[int, str]) -> None:
        """Log each distinct reason an item failed for once per run (a policy that fills the slot, or TRL's
        None, would otherwise leave no trace of why)."""
        for i in sorted(errors):
            reason = failure_reason(errors[i])
            with self._lock:
                if reason in self._reasons:
                    continue
                self._reasons.add(reason)
            log.warning("%s: item %d failed, and others may fail the same way (logged once): %s", self.name, i, errors[i])

    def _warn(self, kind: str, message: str) -> None:
        with self._lock:
            if kind in self._warned:
                return
            self._warned.add(kind)
        text = f"{self.name}: {message}; GRPO advantages are all zero and the policy learns nothing from this reward. {self.hint}"
        log.warning(text)
        warnings.warn(text, ZeroSignalWarning, stacklevel=3)

    def check(self, groups: Sequence[Sequence[int]], candidates: Sequence[Any], rewards: Sequence[Any]) -> None:
        for idx in groups:
            if len(idx) > 1:
                group = [candidates[i] for i in idx]
                if group[0] is not None and all_same(group):  # identity's rule; stops at the first difference
                    self._warn("identical", f"all {len(idx)} candidates of a group are the same input ({_show(candidates[idx[0]])})")
                    break
        scored = [r for r in rewards if r is not None and not (isinstance(r, float) and math.isnan(r))]
        if len(scored) > 1 and len(set(scored)) == 1:
            self._warn("equal", f"every reward of this call is {scored[0]!r} ({len(scored)} items)")


def failure_reason(message: str) -> str:
    """A failure message without the item's own index and path, so one cause logs once (pure)."""
    import re

    text = re.sub(r"^item \d+: ", "", message)
    text = re.sub(r"^render\[\d+\]", "render", text)
    return re.sub(r"(completion|video|candidate)\[\d+\]", r"\1[i]", text)


def failure_kinds(errors: dict[int, str]) -> dict[str, int]:
    """How many items failed in the render hook and how many elsewhere (for the trainer's metrics)."""
    render = sum(1 for m in errors.values() if failure_reason(m).startswith("render"))
    return {"render": render, "other": len(errors) - render}


def _show(value: Any) -> str:
    s = "<bytes>" if isinstance(value, (bytes, bytearray, memoryview)) else str(value)
    return s if len(s) <= 80 else s[:77] + "..."
