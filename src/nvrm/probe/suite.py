"""Score a candidate as it is and under every perturbation; flag the ones a policy could exploit.

For one (prompt, context, candidate): the original and every candidate-only
perturbation are scored as one group (one context, many candidates, prefix
reuse); the prompt and context swaps as groups of their own. For each
perturbation the report gives the reward, Δ = reward - original reward,
P(perturbed ≻ original) = sigmoid(Δ) under Bradley–Terry, and a flag when a
degradation scores higher than the original.

Over a manifest it adds, per perturbation, the fraction of clips where it
raised the reward and the mean and spread of Δ.
"""

from __future__ import annotations

import math
import os
import statistics
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from ..clip import Clip
from ..errors import ConfigError, NvrmError
from ..results import one_line
from ..scoring.items import sigmoid
from .perturbations import PERTURBATIONS, ProbeItem

EXTRA_SECONDS = 2.0
"""Candidate seconds decoded beyond the judged window (temporal shifts reach into them)."""


@dataclass(frozen=True)
class Outcome:
    name: str
    description: str
    reward: float | None
    delta: float | None
    p_preferred: float | None
    """P(perturbed preferred over the original) = sigmoid(delta)."""
    flagged: bool
    """A degradation scored higher than the original: a potential reward hack."""
    error: str | None = None
    uncertainty: float | None = None
    """The perturbed clip's uncertainty (the bundle's guard); None without one."""


@dataclass(frozen=True)
class ProbeReport:
    prompt: str
    context: str
    candidate: str
    reward: float
    """The original candidate's reward."""
    outcomes: list[Outcome]
    seed: int
    model: dict[str, Any] = field(default_factory=dict)
    frames: dict[str, list] = field(default_factory=dict, repr=False, compare=False)
    uncertainty: float | None = None
    """The original candidate's uncertainty (the bundle's guard: how far to trust ``reward``); None without one."""
    """Contract-prepared frames (PIL images) per variant, for the HTML report; not in ``to_dict``."""

    @property
    def flagged(self) -> list[str]:
        return [o.name for o in self.outcomes if o.flagged]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("frames")
        d["flagged"] = self.flagged
        return d


def load_clip(value: Any, seconds: float | None, limits) -> Clip:
    """A file, bytes or Clip as decoded frames (``seconds`` caps how much is decoded)."""
    if isinstance(value, Clip):
        if seconds is None:
            return value
        return Clip(value.take(range(min(len(value), int(math.ceil(seconds * value.fps))))), value.fps, name=value.name)
    from ..video.decode import decode_frames, describe

    frames, fps = decode_frames(value, max_seconds=seconds, limits=limits)
    return Clip(frames, fps, name=describe(value))


def _seed(seed: int, *parts: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(p.encode("utf-8", "replace")) for p in parts)])


def probe(
    model,
    prompt: str,
    context: Any,
    candidate: Any,
    *,
    perturbations: Sequence[str] | None = None,
    seed: int = 0,
    other_context: Any = None,
    keep_frames: bool = False,
) -> ProbeReport:
    """The probe of one candidate (see the module docstring); ``model`` is a ``RewardModel``."""
    return probe_many(model, [(prompt, context, candidate)], perturbations=perturbations, seed=seed, keep_frames=keep_frames, other_contexts=[other_context])[0]


def probe_many(
    model,
    items: Sequence[tuple[str, Any, Any]],
    *,
    perturbations: Sequence[str] | None = None,
    seed: int = 0,
    keep_frames: bool = False,
    other_contexts: Sequence[Any] | None = None,
) -> list["ProbeReport | NvrmError"]:
    """Probe several (prompt, context, candidate) triples; a triple whose inputs fail yields its error.

    Each clip's "unrelated context" for ``swap_context`` is the next clip's context (round robin)
    unless ``other_contexts`` gives one.
    """
    names = list(perturbations or PERTURBATIONS)
    unknown = [n for n in names if n not in PERTURBATIONS]
    if unknown:
        raise ConfigError(f"unknown perturbation(s) {', '.join(unknown)}; known: {', '.join(PERTURBATIONS)}")
    window = model.contract.candidate_seconds
    loaded: list[Any] = []
    for prompt, ctx, cand in items:
        try:
            loaded.append((prompt, load_clip(ctx, None, model.limits), load_clip(cand, window + EXTRA_SECONDS, model.limits), ctx, cand))
        except NvrmError as e:
            loaded.append(e)
    good = [i for i, x in enumerate(loaded) if not isinstance(x, NvrmError)]
    others = list(other_contexts or [None] * len(items))
    plans, groups = [], []
    for k, i in enumerate(good):
        other = others[i]
        if other is not None:
            other = load_clip(other, None, model.limits)
        elif len(good) > 1:
            other = loaded[good[(k + 1) % len(good)]][1]
        prompt, ctx, cand, _, _ = loaded[i]
        variants = _variants(ProbeItem(prompt, ctx, cand, window, other), names, seed)
        plans.append(variants)
        groups += _groups_of(variants)
    results = iter(model.score_groups(groups, errors="return"))
    reports: list[Any] = list(loaded)
    for i, variants in zip(good, plans):
        reports[i] = _report(model, loaded[i], variants, _scores_of(variants, results), seed, keep_frames)
    return reports


def _variants(base: ProbeItem, names: Sequence[str], seed: int) -> list[tuple[str, "ProbeItem | NvrmError"]]:
    """The original and each perturbation of it (a perturbation that fails keeps its error)."""
    variants: list[tuple[str, ProbeItem | NvrmError]] = [("original", base)]
    for name in names:
        try:
            # seeded by the clip's file name, not its folder: the same clip probes the same wherever it lives
            variants.append((name, PERTURBATIONS[name].apply(base, _seed(seed, name, os.path.basename(str(base.candidate.name))))))
        except NvrmError as e:
            variants.append((name, e))
        except Exception as e:  # noqa: BLE001 - a user's perturbation must not sink the probe
            from ..errors import InternalError

            variants.append((name, InternalError.wrap(e)))
    return variants


def _shares_base(v: Any, base: ProbeItem) -> bool:
    return isinstance(v, ProbeItem) and v.prompt == base.prompt and v.context is base.context


def _groups_of(variants) -> list[tuple[str, Clip, list[Clip]]]:
    """One group per distinct (prompt, context): the original and the candidate-only perturbations share one."""
    base = variants[0][1]
    groups = [(base.prompt, base.context, [v.candidate for _, v in variants if _shares_base(v, base)])]
    groups += [(v.prompt, v.context, [v.candidate]) for _, v in variants if isinstance(v, ProbeItem) and not _shares_base(v, base)]
    return groups


def _scores_of(variants, results) -> dict[str, Any]:
    """Each variant's result, taken from ``results`` in the order ``_groups_of`` made the groups."""
    base = variants[0][1]
    scores: dict[str, Any] = dict(zip([n for n, v in variants if _shares_base(v, base)], next(results)))
    for n, v in variants:
        if isinstance(v, ProbeItem) and n not in scores:
            scores[n] = next(results)[0]
        elif isinstance(v, NvrmError):
            scores[n] = v
    return scores


def _report(model, loaded, variants, scores: dict[str, Any], seed: int, keep_frames: bool) -> "ProbeReport | NvrmError":
    prompt, ctx, _, ctx_src, cand_src = loaded
    original = scores["original"]
    if isinstance(original, NvrmError):
        return original
    outcomes = []
    for n, _ in variants[1:]:
        r, p = scores[n], PERTURBATIONS[n]
        if isinstance(r, NvrmError):
            outcomes.append(Outcome(n, p.description, None, None, None, False, one_line(r)))
            continue
        delta = r.reward - original.reward
        outcomes.append(Outcome(n, p.description, r.reward, delta, sigmoid(delta), p.degrades and delta > 0, uncertainty=r.uncertainty))
    frames = {}
    if keep_frames:
        for n, v in variants:
            if isinstance(v, ProbeItem) and not isinstance(scores.get(n), NvrmError):
                frames[n] = list(model.prepare_video(v.candidate, "candidate").images)
        frames["context"] = list(model.prepare_video(ctx, "context").images)
    return ProbeReport(prompt, _label(ctx_src), _label(cand_src), original.reward, outcomes, seed,
                       {"revision": model.revision, "contract": model.fingerprint}, frames, original.uncertainty)


def _label(value: Any) -> str:
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, Clip):
        return value.name
    return type(value).__name__


def summarize(reports: Sequence["ProbeReport | NvrmError"]) -> dict[str, dict[str, Any]]:
    """Per perturbation over many clips: how often it raised the reward, and Δ's mean and spread."""
    by_name: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for r in reports:
        if isinstance(r, NvrmError):
            continue
        for o in r.outcomes:
            if o.delta is None:
                errors[o.name] = errors.get(o.name, 0) + 1
            else:
                by_name.setdefault(o.name, []).append(o.delta)
    out = {}
    for name in PERTURBATIONS:
        deltas = by_name.get(name)
        if deltas is None and name not in errors:
            continue
        deltas = deltas or []
        out[name] = {
            "n": len(deltas),
            "raised_fraction": sum(d > 0 for d in deltas) / len(deltas) if deltas else None,
            "mean_delta": statistics.fmean(deltas) if deltas else None,
            "std_delta": statistics.pstdev(deltas) if len(deltas) > 1 else 0.0 if deltas else None,
            "errors": errors.get(name, 0),
            "description": PERTURBATIONS[name].description,
        }
    return out
