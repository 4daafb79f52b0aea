"""Fitting a guard for a bundle: read genuine candidates, hack some, learn to tell them apart (``nvrm.guard``).

    guard = nvrm.train.fit_guard(model, "pairs.jsonl")           # what `nvrm guard fit` runs
    nvrm.guard.write_bundle_guard(bundle, guard)                  # nvrm_guard.safetensors + its manifest entry

It lives in ``nvrm.train`` because it is training: it reads preference pairs and attacks the model through its
differentiable reward; ``nvrm.guard`` holds only what scoring runs.

1. **Genuine**: every distinct (prompt, context, video) of the pairs (both sides; the format ``nvrm train``
   reads), and any reference clips, read through the model as ``score_group`` scores them.
2. **Hacked**: candidates of the pairs (mostly the rejected ones, which a policy has most to gain from)
   through signed gradient ascent on the reward (``nvrm.train.ascent``), with budgets of 4 to 32 levels, 4 to 16
   steps, a third written to H.264 and decoded again. Then, for each adaptive round, more of them ascending
   the *conservative* reward of the guard fitted so far: the combination learns what an attacker who knows
   it does, too.
3. ``combine.build_guard`` fits the densities and the combination. A held-out check (examples the fit did not
   use, hacked at other budgets) is measured first and recorded in the guard's ``info``.

Everything is seeded. The cost is the attacks: a forward and a backward per step per batch of candidates.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ConfigError, InputError, NvrmError
from ..guard.collect import read_group
from ..guard.combine import build_guard
from ..guard.fit_settings import GuardFitSettings
from ..guard.reading import Reading
from ..guard.trust import Guard
from .ascent import Ascent, ascend

from ..guard.fit_settings import BUDGETS, MIN_PAIRS, STEPS  # noqa: E402


@dataclass
class _Side:
    prompt: str
    context: str
    video: str
    rejected: bool


@dataclass
class _Data:
    readings: list[Reading] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    def add(self, reading: Reading | None, example: str) -> None:
        if reading is not None:
            self.readings.append(reading)
            self.examples += [example] * len(reading)

    def where(self, keep: Callable[[str], bool]) -> Reading | None:
        rows = [i for i, e in enumerate(self.examples) if keep(e)]
        if not rows:
            return None
        return Reading.cat(self.readings).select(rows)

    def groups(self, keep: Callable[[str], bool]) -> list[str]:
        """The example of each row ``where(keep)`` holds, in order."""
        return [e for e in self.examples if keep(e)]


def sides_of(pairs: Sequence[Any]) -> list[_Side]:
    """Every distinct (prompt, context, video) of the pairs, the rejected sides marked."""
    seen: dict[tuple[str, str, str], _Side] = {}
    for p in pairs:
        (cp, cc, cv), (rp, rc, rv) = p.sides
        seen.setdefault((cp, cc, cv), _Side(cp, cc, cv, False))
        side = seen.setdefault((rp, rc, rv), _Side(rp, rc, rv, True))
        side.rejected = side.rejected or not p.tie
    return list(seen.values())


def fit_guard(
    model, pairs: str | Path | Sequence[Any], *, references: Sequence[Any] = (), settings: GuardFitSettings | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Guard:
    """A guard for ``model`` (a loaded ``RewardModel`` on nvrm's engine) from preference ``pairs`` (a file or ``Pair``s)
    and optional reference ``(prompt, context, video)`` triples of genuine candidates (module docstring)."""
    from ..bundle import weights_fingerprint
    from ..prefs.pairs import Pair, read_pairs

    s = settings or GuardFitSettings()
    rows = read_pairs(pairs) if isinstance(pairs, (str, Path)) else list(pairs)
    usable = [p for p in rows if isinstance(p, Pair)]
    if len(usable) < MIN_PAIRS:
        raise InputError(str(pairs) if isinstance(pairs, (str, Path)) else "pairs",
                         f"{len(usable)} usable pair(s); a guard needs at least {MIN_PAIRS} (give more preference pairs)")
    if model.path is None or getattr(model, "runtime", None) is None:
        raise ConfigError("fit_guard needs a model loaded from a bundle folder on nvrm's engine (backend='nvrm')")
    sides = sides_of(usable) + [_Side(str(p), c, v, False) for p, c, v in references]
    examples = sorted({(sd.prompt, str(sd.context)) for sd in sides})
    rng = random.Random(s.seed)
    held = set(rng.sample(examples, int(round(len(examples) * s.holdout)))) if s.holdout > 0 and len(examples) >= 5 else set()
    genuine = _read_genuine(model, sides, say)
    guard_for = {"model": weights_fingerprint(model.path), "preprocessing": model.fingerprint}
    hacked = _Data()
    pool = [sd for sd in sides if (sd.prompt, str(sd.context)) not in held]
    _attack(model, pool, rng, s.attacks, None, hacked, s, say)
    fit_only = lambda e: e not in held_keys  # noqa: E731
    held_keys = {f"{p}\x00{c}" for p, c in held}
    guard = _build(genuine, hacked, fit_only, s.seed, guard_for)
    for r in range(s.adaptive_rounds):
        model.guard = guard
        try:
            _attack(model, pool, rng, s.attacks, s.conservative, hacked, s, say)
        finally:
            model.guard = None
        guard = _build(genuine, hacked, fit_only, s.seed + r + 1, guard_for)
    info: dict[str, Any] = {"method": "density+frame statistics+logistic combination (nvrm.guard)", "pairs": len(usable),
                            "genuine": len(genuine.examples), "hacked": len(hacked.examples), "adaptive_rounds": s.adaptive_rounds,
                            "seed": s.seed}
    if held:
        held_attacked = _Data()
        held_pool = [sd for sd in sides if (sd.prompt, str(sd.context)) in held]
        model.guard = guard
        try:
            _attack(model, held_pool, rng, max(8, s.attacks // 4), None, held_attacked, s, say)
            _attack(model, held_pool, rng, max(8, s.attacks // 4), s.conservative, held_attacked, s, say)
        finally:
            model.guard = None
        info["holdout"] = _holdout_report(guard, genuine.where(lambda e: e in held_keys), held_attacked.where(lambda e: True))
        say(f"held-out check: {info['holdout']}")
    return _build(genuine, hacked, lambda e: True, s.seed, {**guard_for, "info": info})


def _build(genuine: _Data, hacked: _Data, keep: Callable[[str], bool], seed: int, extra: dict[str, Any]) -> Guard:
    return build_guard(genuine.where(keep), hacked.where(keep), seed=seed, genuine_groups=genuine.groups(keep),  # type: ignore[arg-type]
                       hacked_groups=hacked.groups(keep), **extra)


def _key(prompt: str, context: Any) -> str:
    return f"{prompt}\x00{context}"


def _read_genuine(model, sides: Sequence[_Side], say: Callable[[str], None]) -> _Data:
    data = _Data()
    by_condition: dict[tuple[str, str], list[_Side]] = {}
    for sd in sides:
        by_condition.setdefault((sd.prompt, str(sd.context)), []).append(sd)
    failed = 0
    for (prompt, context), group in by_condition.items():
        try:
            results, reading = read_group(model, prompt, context, [sd.video for sd in group])
        except NvrmError:
            failed += len(group)
            continue
        failed += sum(isinstance(r, NvrmError) for r in results)
        data.add(reading, _key(prompt, context))
    say(f"read {len(data.examples)} genuine candidate(s) under {len(by_condition)} condition(s)" + (f"; {failed} could not be read" if failed else ""))
    if len(data.examples) < 2 * MIN_PAIRS:
        raise InputError("pairs", f"only {len(data.examples)} candidate(s) could be read; a guard needs at least {2 * MIN_PAIRS}")
    return data


def _attack(model, pool: Sequence[_Side], rng: random.Random, count: int, conservative: float | None, out: _Data,
            s: GuardFitSettings, say: Callable[[str], None]) -> None:
    """Hack ``count`` candidates drawn from ``pool`` (rejected sides three times as often), batch by shared condition."""
    from ..video.inputs import sample_input

    if not pool:
        return
    weights = [3.0 if sd.rejected else 1.0 for sd in pool]
    chosen = rng.choices(range(len(pool)), weights=weights, k=count)
    by_condition: dict[tuple[str, str], list[int]] = {}
    for i in chosen:
        by_condition.setdefault((pool[i].prompt, str(pool[i].context)), []).append(i)
    contract = model.contract
    done = 0
    for (prompt, context), idx in by_condition.items():
        frames = []
        for i in idx:
            try:
                images, _, _ = sample_input(pool[i].video, "candidate", contract, model.limits)
            except NvrmError:
                continue
            frames.append(np.stack([np.asarray(im) for im in images]))
        shapes: dict[tuple, list[np.ndarray]] = {}
        for f in frames:
            shapes.setdefault(f.shape, []).append(f)
        for same in shapes.values():
            for start in range(0, len(same), s.batch):
                part = same[start: start + s.batch]
                attacks = []
                for _ in part:
                    budget = rng.choice(BUDGETS) / 255.0
                    attacks.append(Ascent(budget, max(1 / 255, budget / 4), rng.choice(STEPS), conservative))
                try:
                    hacked = ascend(model, prompt, context, part, contract.sample_fps, attacks)
                except NvrmError:
                    continue
                hacked = [reencode(h, contract.sample_fps, rng.choice((18, 23, 28))) if rng.random() < 1 / 3 else h for h in hacked]
                from ..clip import Clip

                _, reading = read_group(model, prompt, context, [Clip(h, contract.sample_fps) for h in hacked])
                out.add(reading, _key(prompt, context))
                done += len(hacked)
    say(f"hacked {done} candidate(s)" + (f" ascending reward - {conservative:g} x uncertainty" if conservative is not None else " ascending the reward"))


def reencode(frames: np.ndarray, fps: float, crf: int) -> np.ndarray:
    """uint8 ``[T, H, W, 3]`` frames through H.264 (yuv420p, ``crf``) and back, in memory (even sizes are padded)."""
    import av

    t, h, w, _ = frames.shape
    ph, pw = h + h % 2, w + w % 2
    padded = np.pad(frames, ((0, 0), (0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=max(1, int(round(fps))))
        stream.width, stream.height, stream.pix_fmt = pw, ph, "yuv420p"
        stream.options = {"crf": str(crf), "preset": "ultrafast", "bframes": "0"}
        for f in padded:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    buf.seek(0)
    with av.open(buf) as src:
        back = np.stack([fr.to_ndarray(format="rgb24") for fr in src.decode(video=0)])
    return np.ascontiguousarray(back[:t, :h, :w])


def _holdout_report(guard: Guard, genuine: Reading | None, hacked: Reading | None) -> dict[str, Any]:
    """AUROC of the uncertainty (hacked vs genuine) on examples the fit did not use, and the counts."""
    if genuine is None or hacked is None:
        return {}
    from ..guard.separation import auroc

    g = guard.uncertainty(genuine.to(guard.device)).cpu().tolist()
    h = guard.uncertainty(hacked.to(guard.device)).cpu().tolist()
    return {"auroc": round(auroc(h, g), 4), "genuine": len(g), "hacked": len(h)}


def read_references(path: str | Path) -> list[tuple[str, str, str]]:
    """Genuine reference candidates from a JSONL file (``prompt``, ``context``, ``video``; paths relative to the file):
    (prompt, context, video) triples. A bad line is one ``InputError`` naming it."""
    import json

    from ..video.paths import resolve_path

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"cannot read the references file ({e})") from e
    out = []
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise ValueError("expected an object with a string 'prompt'")
            out.append((obj["prompt"], resolve_path(path.parent, obj.get("context"), "'context'"), resolve_path(path.parent, obj.get("video"), "'video'")))
        except (ValueError, RecursionError) as e:
            raise InputError(f"{path} line {n}", f"not a reference row ({e}); expected {{\"prompt\", \"context\", \"video\"}}") from e
    if not out:
        raise InputError(str(path), "the references file has no rows")
    return out
