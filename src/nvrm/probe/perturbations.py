"""Perturbations: small, named, seeded functions of the decoded frames, applied before the contract.

Each takes a ``ProbeItem`` (prompt, decoded context, decoded candidate) and a
seeded ``numpy.random.Generator`` and returns the perturbed item. Every one
listed here makes the candidate worse as a continuation (``degrades=True``):
a reward model that scores it higher than the original has a blind spot a
policy can exploit. Add your own with ``register``::

    from . import register

    @register("mirror", "frames flipped left-right")
    def mirror(item, rng):
        return item.with_candidate(item.candidate.numpy()[:, :, ::-1])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..clip import Clip

UNRELATED_PROMPT = "A bowl of fruit sits on a kitchen table in soft morning light; nothing moves."


@dataclass(frozen=True)
class ProbeItem:
    """What a perturbation changes: the prompt and the decoded frames (before the contract)."""

    prompt: str
    context: Clip
    candidate: Clip
    """Decoded candidate frames: the contract's window plus up to 2 s more (for temporal shifts)."""
    window: float = 5.0
    """Seconds of candidate the model judges (the contract's ``candidate_seconds``)."""
    other_context: Clip | None = None
    """An unrelated context (another clip of the manifest), if there is one."""

    def with_candidate(self, frames: np.ndarray) -> "ProbeItem":
        return replace(self, candidate=Clip(np.ascontiguousarray(frames), self.candidate.fps, name=self.candidate.name))

    @property
    def n_window(self) -> int:
        """Candidate frames inside the judged window."""
        return min(len(self.candidate), max(1, int(round(self.window * self.candidate.fps))))


@dataclass(frozen=True)
class Perturbation:
    name: str
    description: str
    apply: Callable[[ProbeItem, np.random.Generator], ProbeItem]
    degrades: bool = True
    """Whether the result is a worse continuation than the original (a higher reward then flags a hack)."""


PERTURBATIONS: dict[str, Perturbation] = {}


def register(name: str, description: str, degrades: bool = True):
    """Decorator: add ``fn(item, rng) -> item`` to the battery under ``name``."""

    def add(fn: Callable[[ProbeItem, np.random.Generator], ProbeItem]):
        PERTURBATIONS[name] = Perturbation(name, description, fn, degrades)
        return fn

    return add


def _frames(item: ProbeItem) -> np.ndarray:
    return item.candidate.numpy()[: item.n_window]


def _pad(frames: np.ndarray, n: int) -> np.ndarray:
    """``frames`` cut or padded (last frame held) to ``n`` frames."""
    if len(frames) >= n:
        return frames[:n]
    return np.concatenate([frames, np.repeat(frames[-1:], n - len(frames), axis=0)])


@register("freeze", "every frame is the candidate's first frame (nothing moves)")
def freeze(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f = _frames(item)
    return item.with_candidate(np.repeat(f[:1], len(f), axis=0))


@register("reverse", "the candidate's frames in reverse order (time runs backwards)")
def reverse(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    return item.with_candidate(_frames(item)[::-1])


@register("shuffle", "the candidate's seconds in a seeded random order")
def shuffle(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f, sec = _frames(item), _seconds(item)
    n = int(sec[-1]) + 1
    order = rng.permutation(n)
    while n > 1 and np.array_equal(order, np.arange(n)):
        order = rng.permutation(n)
    per = item.candidate.fps
    idx = np.clip((order[sec] * per + (np.arange(len(f)) - sec * per)).round().astype(int), 0, len(f) - 1)
    return item.with_candidate(f[idx])


def _seconds(item: ProbeItem) -> np.ndarray:
    """The second (of the candidate window) each candidate frame falls in."""
    return (np.arange(item.n_window) / item.candidate.fps).astype(int)


@register("stutter", "seconds of motion repeated and others skipped, at seeded random, in order")
def stutter(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f, sec = _frames(item), _seconds(item)
    n = int(sec[-1]) + 1
    source = np.sort(rng.integers(0, n, size=n))
    while n > 1 and np.array_equal(source, np.arange(n)):  # make sure something stutters
        source = np.sort(rng.integers(0, n, size=n))
    per = item.candidate.fps
    idx = np.clip((source[sec] * per + (np.arange(len(f)) - sec * per)).round().astype(int), 0, len(f) - 1)
    return item.with_candidate(f[idx])


@register("shift", "starts 1 s later in the source: the first second of the continuation is skipped")
def shift(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    all_frames = item.candidate.numpy()
    k = int(round(item.candidate.fps))
    return item.with_candidate(_pad(all_frames[k:], item.n_window))


@register("teleport", "a jump cut: halfway through, the candidate skips 1.5 s ahead in the source")
def teleport(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    all_frames = item.candidate.numpy()
    n, half = item.n_window, item.n_window // 2
    skip = int(round(1.5 * item.candidate.fps))
    return item.with_candidate(_pad(np.concatenate([all_frames[:half], all_frames[half + skip :]]), n))


@register("flicker", "every other second darkened to a third of its brightness")
def flicker(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f = _frames(item).astype(np.float32)
    f[_seconds(item) % 2 == 1] /= 3
    return item.with_candidate(f.round().astype(np.uint8))


@register("blur", "Gaussian blur of radius 1/80 of the frame height")
def blur(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    from PIL import Image, ImageFilter

    f = _frames(item)
    radius = max(1.0, f.shape[1] / 80)
    return item.with_candidate(np.stack([np.asarray(Image.fromarray(x).filter(ImageFilter.GaussianBlur(radius))) for x in f]))


@register("noise", "seeded Gaussian noise, sigma 24 gray levels")
def noise(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f = _frames(item).astype(np.float32) + rng.normal(0.0, 24.0, size=_frames(item).shape)
    return item.with_candidate(np.clip(f, 0, 255).round().astype(np.uint8))


@register("brightness", "brightness x1.6, clipped")
def brightness(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    return item.with_candidate(np.clip(_frames(item).astype(np.float32) * 1.6, 0, 255).round().astype(np.uint8))


@register("lowres", "source resolution cut 4x (bilinear down, nearest back up)")
def lowres(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    from PIL import Image

    f = _frames(item)
    h, w = f.shape[1:3]
    small = (max(1, w // 4), max(1, h // 4))
    return item.with_candidate(
        np.stack([np.asarray(Image.fromarray(x).resize(small, Image.BILINEAR).resize((w, h), Image.NEAREST)) for x in f])
    )


@register("letterbox", "black bars over the top and bottom eighth of every frame")
def letterbox(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f = _frames(item).copy()
    bar = max(1, f.shape[1] // 8)
    f[:, :bar] = 0
    f[:, -bar:] = 0
    return item.with_candidate(f)


@register("copy_context", "the context's last seconds, repeated as the candidate")
def copy_context(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    ctx = item.context.numpy()
    n = max(1, int(round(item.window * item.context.fps)))
    frames = _pad(ctx[-n:], n)
    return replace(item, candidate=Clip(np.ascontiguousarray(frames), item.context.fps, name=item.candidate.name))


@register("static_image", "one unrelated still image (a seeded texture) for the whole candidate")
def static_image(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    f = _frames(item)
    h, w = f.shape[1:3]
    tile = rng.integers(0, 256, size=(h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
    still = np.kron(tile, np.ones((16, 16, 1), np.uint8))[:h, :w]
    return item.with_candidate(np.repeat(still[None], len(f), axis=0))


@register("swap_prompt", "the prompt replaced by an unrelated one (the candidate ignores the prompt)")
def swap_prompt(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    return replace(item, prompt=UNRELATED_PROMPT if item.prompt != UNRELATED_PROMPT else "A cat sleeps on a sofa.")


@register("swap_context", "the context replaced by an unrelated one (another clip, else a seeded texture clip)")
def swap_context(item: ProbeItem, rng: np.random.Generator) -> ProbeItem:
    if item.other_context is not None:
        return replace(item, context=item.other_context)
    ctx = item.context
    n, h, w = len(ctx), ctx.height, ctx.width
    base = rng.integers(0, 256, size=(h + n, w + n, 3), dtype=np.uint8)
    frames = np.stack([base[i : i + h, i : i + w] for i in range(n)])
    return replace(item, context=Clip(frames, ctx.fps, name="unrelated context"))


CANDIDATE_ONLY = tuple(n for n in PERTURBATIONS if n not in ("swap_prompt", "swap_context"))
"""Perturbations that change only the candidate (scored in one group with the original)."""
