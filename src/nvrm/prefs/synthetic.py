"""A synthetic world-model preference task that trains on a CPU.

Each example is a square moving in a straight line at constant speed over a
tiled floor. The context shows the first seconds; the **preferred**
continuation keeps the motion, and each **rejected** one breaks physics in
one way:

- ``freeze``:   the square stops where the context left it;
- ``teleport``: the square jumps to a random place every second;
- ``reverse``:  the square moves back the way it came (time runs backwards);
- ``flicker``:  the motion is right but the square vanishes every other second;

and, since ``nvrm probe`` found that a model trained on those four alone
rewards degradations it never saw, the right motion spoiled in other ways,
made with the probe's own perturbations (``nvrm.probe``): ``stutter``,
``shuffle``, ``noise``, ``brightness``, ``blur``, ``lowres``, ``letterbox``,
a ``static`` unrelated still, and ``copy_context`` (the context repeated).

Clips are written as real encoded videos (H.264 in MP4 via PyAV), so training
and scoring go through the same decoding and preprocessing contract as any
user's data. Frames are small and portrait (64x48), which keeps sequences
short for the contract's height-360 resize.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..probe.perturbations import UNRELATED_PROMPT

PHYSICS = ("freeze", "teleport", "reverse", "flicker")
"""The four kinds of broken motion (the demo's accuracy bar is measured on these)."""
DEGRADED = ("stutter", "shuffle", "shift", "noise", "brightness", "blur", "lowres", "letterbox", "static", "copy_context")
"""The right motion, spoiled by a probe perturbation."""
MISMATCH = ("swap_prompt", "swap_context")
"""The preferred continuation under an unrelated prompt, or after another context (mismatch pairs)."""
VARIANTS = PHYSICS + DEGRADED + MISMATCH

PROMPT = "A square glides across a tiled floor at constant speed."
UNRELATED_PROMPTS = (
    UNRELATED_PROMPT,
    "Waves roll onto a sandy beach at sunset.",
    "A person in a red coat walks down a snowy street.",
    "Close-up of hands kneading bread dough on a wooden counter.",
    "A city skyline at night with traffic streaming below.",
    "A cat sleeps on a sofa.",
)
"""Prompts of ``swap_prompt`` pairs (the first is the probe's own unrelated prompt)."""


@dataclass(frozen=True)
class SynthSpec:
    height: int = 64
    width: int = 48
    fps: int = 4
    context_seconds: int = 3
    candidate_seconds: int = 5
    square: int = 14
    texture: int = 8
    """Tile contrast of the floor (0 = a plain floor)."""
    speed: tuple[float, float] = (4.0, 6.0)
    """Range of the square's speed, source pixels per second."""


def _background(rng: np.random.Generator, spec: SynthSpec) -> np.ndarray:
    base = rng.integers(50, 120, size=3)
    tiles = (base + rng.integers(-spec.texture, spec.texture + 1, size=(spec.height // 8 + 1, spec.width // 8 + 1, 3))).astype(np.uint8)
    return np.kron(tiles, np.ones((8, 8, 1), dtype=np.uint8))[: spec.height, : spec.width]


def _draw(bg: np.ndarray, pos: np.ndarray, color: np.ndarray, size: int, visible: bool = True) -> np.ndarray:
    f = bg.copy()
    if visible:
        y, x = int(round(pos[0])), int(round(pos[1]))
        f[max(0, y) : y + size, max(0, x) : x + size] = color
    return f


@dataclass(frozen=True)
class Motion:
    """An example's hidden truth: its floor, the square's colour, and its straight-line motion (the oracle of ``nvrm bench``)."""

    background: np.ndarray
    color: np.ndarray
    start: np.ndarray
    """(y, x) of the square's top-left at t = 0 (source pixels)."""
    velocity: np.ndarray
    """(dy, dx) per second."""

    def position(self, t: float) -> np.ndarray:
        """(y, x) of the square's top-left at ``t`` seconds on the straight line."""
        return self.start + self.velocity * t


def motion_of(seed: int, spec: SynthSpec = SynthSpec()) -> Motion:
    """The floor, colour and motion of example ``seed`` (the draws ``make_example`` makes first), and the generator after them."""
    return _motion(np.random.default_rng(seed), spec)


def _motion(rng: np.random.Generator, spec: SynthSpec) -> Motion:
    bg = _background(rng, spec)
    color = np.array([rng.integers(200, 256), rng.integers(0, 80), rng.integers(150, 256)], dtype=np.uint8)[rng.permutation(3)]
    limits = np.array([spec.height - spec.square, spec.width - spec.square], dtype=float)
    total = spec.context_seconds + spec.candidate_seconds
    speed = rng.uniform(*spec.speed)
    angle = rng.uniform(0, 2 * np.pi)
    v = np.array([np.sin(angle), np.cos(angle)]) * speed
    # slow down if needed so the whole straight path (context + continuation) stays inside the floor
    travel = np.abs(v) * total
    v = v * min(1.0, float(np.min(limits / np.maximum(travel, 1e-9)))) * 0.95
    lo = np.where(v < 0, -v * total, 0.0)
    p0 = rng.uniform(lo, np.maximum(lo, limits - np.where(v > 0, v * total, 0.0)))
    return Motion(bg, color, p0, v)


def make_example(seed: int, spec: SynthSpec = SynthSpec()) -> dict[str, np.ndarray]:
    """Frames (T, H, W, 3) for the context, the preferred continuation, each rejected variant and an unrelated ``texture_context``."""
    rng = np.random.default_rng(seed)
    motion = _motion(rng, spec)
    bg, color, limits = motion.background, motion.color, np.array([spec.height - spec.square, spec.width - spec.square], dtype=float)
    at = motion.position

    n_ctx, n_cand = spec.context_seconds * spec.fps, spec.candidate_seconds * spec.fps
    t_ctx = np.arange(n_ctx) / spec.fps
    t_cand = spec.context_seconds + np.arange(n_cand) / spec.fps
    t_end = t_ctx[-1]
    context = np.stack([_draw(bg, at(t), color, spec.square) for t in t_ctx])
    good = [at(t) for t in t_cand]
    end = at(t_end)
    jumps = rng.uniform(0, limits, size=(spec.candidate_seconds, 2))
    out = {
        "context": context,
        "preferred": np.stack([_draw(bg, p, color, spec.square) for p in good]),
        "freeze": np.stack([_draw(bg, end, color, spec.square) for _ in t_cand]),
        "teleport": np.stack([_draw(bg, jumps[int(k // spec.fps)], color, spec.square) for k in range(n_cand)]),
        "reverse": np.stack([_draw(bg, at(2 * t_end - t), color, spec.square) for t in t_cand]),
        "flicker": np.stack(
            [_draw(bg, p, color, spec.square, visible=int(k // spec.fps) % 2 == 0) for k, p in enumerate(good)]
        ),
    }
    out.update(_degraded(out["context"], out["preferred"], spec, rng))
    return out


def _degraded(context: np.ndarray, preferred: np.ndarray, spec: SynthSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The preferred continuation through the probe's perturbations (one code path with ``nvrm probe``)."""
    from ..clip import Clip
    from ..probe.perturbations import PERTURBATIONS, ProbeItem

    item = ProbeItem("", Clip(context, spec.fps), Clip(preferred, spec.fps), float(spec.candidate_seconds))
    name_of = {"static": "static_image"}
    out = {v: PERTURBATIONS[name_of.get(v, v)].apply(item, rng).candidate.numpy() for v in DEGRADED}
    out["texture_context"] = PERTURBATIONS["swap_context"].apply(item, rng).context.numpy()  # the probe's fallback context
    return out


def write_task(
    out: str | Path, n_train: int, n_eval: int, *, seed: int = 0, spec: SynthSpec = SynthSpec(), variants: tuple[str, ...] = VARIANTS
) -> dict[str, Path]:
    """Write clips and ``train_pairs.jsonl`` / ``eval_pairs.jsonl`` (one pair per rejected variant per example).

    ``swap_prompt`` and ``swap_context`` are mismatch pairs (see ``nvrm.prefs.pairs``): the
    preferred video under an unrelated prompt, or after another example's context
    (every other example: a seeded texture clip, the probe's fallback).
    """
    from ..synth.clips import write_video

    out = Path(out)
    (out / "clips").mkdir(parents=True, exist_ok=True)
    files = {}
    for split, count, offset in (("train", n_train, 0), ("eval", n_eval, 1_000_000)):
        lines = []
        previous_context = None
        for i in range(count):
            ex_seed = seed * 7_919 + offset + i
            frames = make_example(ex_seed, spec)
            stem = f"{split}{i:05d}"
            texture = "swap_context" in variants and (i % 2 == 0 or previous_context is None)
            paths = {}
            for name, arr in frames.items():
                wanted = name in ("context", "preferred") or name in variants or (name == "texture_context" and texture)
                if not wanted:
                    continue
                rel = f"clips/{stem}_{name}.mp4"
                write_video(out / rel, arr, spec.fps, options={"crf": "18"})
                paths[name] = rel
            rng = np.random.default_rng([ex_seed, 1])
            for variant in variants:
                row = {"id": f"{stem}-{variant}", "prompt": PROMPT, "context": paths["context"], "chosen": paths["preferred"]}
                if variant == "swap_prompt":
                    row.update(rejected=paths["preferred"], rejected_prompt=UNRELATED_PROMPTS[int(rng.integers(len(UNRELATED_PROMPTS)))])
                elif variant == "swap_context":
                    row.update(rejected=paths["preferred"], rejected_context=paths["texture_context"] if texture else previous_context)
                else:
                    row["rejected"] = paths[variant]
                lines.append(json.dumps({**row, "kind": variant}))
            previous_context = paths["context"]
        path = out / f"{split}_pairs.jsonl"
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
        files[split] = path
    return files
