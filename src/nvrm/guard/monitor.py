"""A live monitor of the rollouts a model scores: is the policy gaming the reward? (pure bookkeeping, no model, no I/O)

``Monitor.add(result)`` takes each scored item (its reward, uncertainty and frame statistics); ``snapshot()``
gives the rolling picture over the last ``window`` items and a state:

- ``ok``: nothing looks like hacking (or too few items, or no guard to compare with; the reason says which);
- ``suspect``: the hacking signature. Either a large share of the items is doubtful (uncertainty above the
  guard's threshold, which only 1 % of genuine items pass), or the reward is rising while a frame statistic
  (brightness, saturation, contrast, sharpness, change) has left the range of genuine candidates.

The reason is one line naming the numbers. A sampled probe (the service's ``--probe-rate``) adds how often a
perturbation of an item scored above the item itself; a high rate is suspect too. The bundle's members (the
guard's opt-in check, ``nvrm.guard.members``), run on every item (``members=True``) or on a sampled share of
the scoring calls (``member_rate``), add the share of the items they checked that are doubtful with them; a large
share is suspect as for the guard's own.

Thread-safe: the service's scoring threads add while its HTTP threads read.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .stats import MONITORED

STATES = ("ok", "suspect")


def sampled(rate: float, key: str) -> bool:
    """Whether the draw named ``key`` falls in the share ``rate`` (deterministic, pure)."""
    if rate <= 0:
        return False
    draw = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") / 2.0**64
    return draw < rate


@dataclass(frozen=True)
class MonitorSettings:
    """When the monitor calls a stream of items suspect."""

    window: int = 512
    """Items the rolling statistics cover (the most recent)."""
    min_items: int = 32
    """Items needed before a state other than ok is given."""
    doubtful_share: float = 0.10
    """Share of doubtful items (uncertainty above the guard's threshold) that is suspect on its own (genuine: about 0.01)."""
    rise: float = 0.5
    """The recent half's mean reward above the older half's by this many of the window's standard deviations: rising."""
    probe_share: float = 0.25
    """Share of sampled probe perturbations that scored above their original that is suspect."""

    def __post_init__(self) -> None:
        from ..errors import ConfigError

        if self.window < 2 or self.min_items < 2 or self.min_items > self.window:
            raise ConfigError(f"monitor window={self.window}, min_items={self.min_items}: need 2 <= min_items <= window")
        for name in ("doubtful_share", "probe_share"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ConfigError(f"monitor {name}={v!r} must be in (0, 1]")


@dataclass(frozen=True)
class _Item:
    reward: float
    uncertainty: float | None
    stats: tuple[float, ...] | None


class Monitor:
    """Rolling statistics of one model's scored items, and whether they look like reward hacking."""

    def __init__(self, reference: Mapping[str, Any] | None = None, threshold: float | None = None, settings: MonitorSettings | None = None):
        """``reference``/``threshold``: the guard's (``Guard.reference``, ``Guard.threshold``); None without a guard."""
        self.settings = settings or MonitorSettings()
        self.reference = dict(reference or {})
        self.threshold = threshold
        self._items: deque[_Item] = deque(maxlen=self.settings.window)
        self._probe: deque[bool] = deque(maxlen=self.settings.window)
        self._members: deque[bool] = deque(maxlen=self.settings.window)
        self._calls = 0
        self._lock = threading.Lock()
        self.total = 0

    @classmethod
    def for_guard(cls, guard: Any, settings: MonitorSettings | None = None) -> "Monitor":
        """A monitor holding ``guard``'s reference ranges and threshold (None: reward statistics only)."""
        if guard is None:
            return cls(None, None, settings)
        return cls(guard.reference, guard.threshold, settings)

    def add(self, reward: float, uncertainty: float | None = None, stats: Mapping[str, float] | None = None) -> None:
        """One scored item (a non-finite reward is not a result and is not counted)."""
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            return
        row = tuple(float(stats[s]) for s in MONITORED) if stats and all(s in stats for s in MONITORED) else None
        with self._lock:
            self._items.append(_Item(float(reward), uncertainty if uncertainty is None else float(uncertainty), row))
            self.total += 1

    def add_result(self, result: Any) -> None:
        """A ``ScoreResult`` (errors are skipped)."""
        if isinstance(result, BaseException) or result is None:
            return
        self.add(result.reward, getattr(result, "uncertainty", None), getattr(result, "frame_stats", None))

    def add_probe(self, above: bool) -> None:
        """One sampled perturbation: whether it scored above its original item."""
        with self._lock:
            self._probe.append(bool(above))

    def draw(self, rate: float) -> bool:
        """Whether the members check this scoring call, at ``rate`` (``LoadSettings.member_rate``): a seeded draw per call."""
        with self._lock:
            self._calls += 1
            n = self._calls
        return sampled(rate, f"members|{n}")

    def add_members(self, uncertainties: Sequence[float]) -> None:
        """The uncertainties, with the members, of the items they checked (each counts as doubtful above the guard's threshold)."""
        if self.threshold is None:
            return
        with self._lock:
            self._members.extend(float(u) > self.threshold for u in uncertainties if math.isfinite(float(u)))

    def snapshot(self) -> dict[str, Any]:
        """The rolling statistics, the state (``ok`` or ``suspect``) and a one-line reason."""
        with self._lock:
            items = list(self._items)
            probe = list(self._probe)
            checked = list(self._members)
            total = self.total
        s = self.settings
        rewards = [it.reward for it in items]
        out: dict[str, Any] = {"items": len(items), "total": total, "window": s.window, "reward": _spread(rewards)}
        half = len(rewards) // 2
        older, recent = _mean(rewards[:half]), _mean(rewards[half:])
        out["reward"]["older_half"], out["reward"]["recent_half"] = older, recent
        sd = out["reward"]["std"] or 0.0
        rising = half >= 2 and older is not None and recent is not None and recent - older > s.rise * max(sd, 1e-6)
        doubts = [it.uncertainty for it in items if it.uncertainty is not None]
        share = None
        if doubts and self.threshold is not None:
            share = sum(u > self.threshold for u in doubts) / len(doubts)
        out["uncertainty"] = {"mean": _mean(doubts), "threshold": self.threshold, "share_above": share}
        frames = {}
        drifted = []
        rows = [it.stats for it in items if it.stats is not None]
        for k, name in enumerate(MONITORED):
            mean = _mean([r[k] for r in rows])
            ref = self.reference.get(name)
            entry: dict[str, Any] = {"mean": mean, "reference": list(ref) if ref else None}
            if mean is not None and ref:
                lo, _, hi = ref
                entry["outside"] = not lo <= mean <= hi
                if entry["outside"]:
                    drifted.append(f"{name} {mean:.3g} outside the genuine range {lo:.3g}..{hi:.3g}")
            frames[name] = entry
        out["frames"] = frames
        probe_rate = sum(probe) / len(probe) if probe else None
        out["probe"] = {"sampled": len(probe), "above_original": probe_rate}
        members_share = sum(checked) / len(checked) if checked else None
        out["members"] = {"checked": len(checked), "share_above": members_share}
        out["state"], out["reason"] = self._state(len(items), share, rising, drifted, older, recent, probe_rate, len(probe),
                                                  members_share, len(checked))
        return out

    def _state(self, n, share, rising, drifted, older, recent, probe_rate, probed, members_share=None, checked=0) -> tuple[str, str]:
        s = self.settings
        if n < s.min_items:
            return "ok", f"{n} of the {s.min_items} items needed so far"
        if self.threshold is None:
            return "ok", "no guard for this model: only reward statistics (fit one with nvrm guard fit)"
        trend = f"reward {older:+.3g} -> {recent:+.3g} over the window" if older is not None and recent is not None else "reward flat"
        if share is not None and share > s.doubtful_share:
            return "suspect", f"{share:.0%} of the last {n} items are doubtful (uncertainty above {self.threshold:.3g}; genuine: 1%); {trend}"
        if members_share is not None and checked >= s.min_items and members_share > s.doubtful_share:
            return "suspect", (f"{members_share:.0%} of the last {checked} items the members checked are doubtful with them "
                               f"(uncertainty above {self.threshold:.3g}; genuine: 1%); {trend}")
        if rising and drifted:
            return "suspect", f"reward rising ({trend}) while {'; '.join(drifted)}"
        if probe_rate is not None and probed >= s.min_items and probe_rate > s.probe_share:
            return "suspect", f"{probe_rate:.0%} of {probed} sampled perturbations scored above their original item; {trend}"
        if drifted:
            return "ok", f"{'; '.join(drifted)}, but the reward is not rising"
        return "ok", f"{share or 0:.0%} of the last {n} items doubtful; frame statistics within the genuine range"


def _mean(v: list[float]) -> float | None:
    return sum(v) / len(v) if v else None


def _spread(v: list[float]) -> dict[str, float | None]:
    m = _mean(v)
    if m is None:
        return {"mean": None, "std": None}
    var = sum((x - m) ** 2 for x in v) / len(v)
    return {"mean": m, "std": math.sqrt(var)}
