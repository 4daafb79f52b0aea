"""Where the context comes from for trainers whose reward call has no field for it (VideoAlign-shaped
callers, FastVideo, verl-omni), and how their rollouts become candidates.

One rule, stated once; exactly one source is chosen:

- ``context=``: a fixed context: one for every item (a path, bytes, ``Clip``, an image), a mapping
  ``{prompt: context}``, or a callable ``context(prompt) -> context`` (one per prompt: an
  image-to-video policy's conditioning image is its context);
- ``context_key=``: each item's metadata (``extra_info``, ``metadata=``) carries it under this key;
- ``context_frames=N``: the rollout's first N frames are its context (as ``--context-frames`` does for
  cosmos-rl; ``N=1``: the image an image-to-video policy generated from) and the rest is the candidate;
- ``no_context=True``: the contract's off-contract opt-in, text-to-video with nothing before it.

A missing context is a one-line error naming where it was looked for. Grouping is the scorer's one
rule (``nvrm.source.reward_source.group_items``): items of one call with the same prompt and equal context content
are one group, scored with one prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..clip import Clip, is_tensor
from ..errors import ConfigError, InputError
from .calls import Call, check_items

LAYOUTS = ("auto", "TCHW", "CTHW", "THWC")
"""How one rollout's video tensor is laid out (``auto``: by where its 3 colour channels are)."""


@dataclass(frozen=True)
class ContextRule:
    """A validated choice of where each item's context comes from."""

    context: Any = None
    """A fixed context, a ``{prompt: context}`` mapping or a callable ``context(prompt)``."""
    context_key: str | None = None
    """The metadata key that carries each item's context."""
    context_frames: int = 0
    """Leading frames of each rollout that are its context (0: the rollout is all candidate)."""
    no_context: bool = False
    """Off-contract opt-in: score with no context (text-to-video)."""

    def __post_init__(self) -> None:
        chosen = [name for name, on in (("context", self.context is not None), ("context_key", self.context_key is not None),
                                        ("context_frames", bool(self.context_frames)), ("no_context", self.no_context)) if on]
        if isinstance(self.context_frames, bool) or not isinstance(self.context_frames, int) or self.context_frames < 0:
            raise ConfigError(f"context_frames={self.context_frames!r}: must be a whole number >= 0")
        if self.context_key is not None and (not isinstance(self.context_key, str) or not self.context_key):
            raise ConfigError(f"context_key={self.context_key!r}: must be a non-empty string")
        if len(chosen) > 1:
            raise ConfigError(f"{' and '.join(chosen)} both given; the context comes from exactly one of them")
        if not chosen:
            raise ConfigError("no context source: give context= (fixed, or per prompt), context_key= (metadata), "
                              "context_frames= (the rollout's leading frames) or no_context=True (off-contract, text-to-video)")

    @property
    def where(self) -> str:
        """How messages name the source."""
        if self.context_key is not None:
            return f"metadata[i][{self.context_key!r}]"
        if isinstance(self.context, Mapping):
            return "context[prompt]"
        return "context(prompt)" if callable(self.context) else "context"

    def lookup(self, prompt: Any, meta: Any) -> Any:
        """The context for one item (``None`` when it has none, or under ``context_frames``)."""
        if self.context_key is not None:
            return meta.get(self.context_key) if isinstance(meta, Mapping) else None
        if isinstance(self.context, Mapping):
            return self.context.get(prompt) if isinstance(prompt, str) else None
        if callable(self.context):
            return self.context(prompt)
        return self.context


def frames_of(video: Any, layout: str, where: str) -> Any:
    """One rollout as ``[T, C, H, W]`` or ``[T, H, W, 3]`` (what ``video_of`` takes), or an ``InputError``.

    ``auto`` reads the layout from where the 3 colour channels are, and refuses a shape where that is
    ambiguous (three frames of three-pixel rows...) with the fix: name the layout.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r}: must be one of {', '.join(LAYOUTS)}")
    if not (is_tensor(video) or hasattr(video, "shape")):
        return video  # a path or bytes: passed on as it is
    shape = tuple(video.shape)
    if len(shape) == 3:
        return InputError(where, f"is one image of shape {shape}; a still image is not a 5 s continuation (the candidate must be a video)")
    if len(shape) != 4:
        return InputError(where, f"has shape {shape}; expected one video, [T, C, H, W], [C, T, H, W] or [T, H, W, 3]")
    if layout == "auto":
        fits = [name for name, axis in (("TCHW", 1), ("CTHW", 0), ("THWC", 3)) if shape[axis] == 3]
        if len(fits) != 1:
            seen = " or ".join(fits) or "no axis of 3 channels"
            return InputError(where, f"has shape {shape}: its layout is ambiguous ({seen}); set layout=")
        layout = fits[0]
    axis = {"TCHW": 1, "CTHW": 0, "THWC": 3}[layout]
    if shape[axis] != 3:
        return InputError(where, f"has shape {shape}, not {layout} with 3 colour channels")
    if layout == "CTHW":
        return video.permute(1, 0, 2, 3) if is_tensor(video) else video.transpose(1, 0, 2, 3)
    return video


def split_leading(candidate: Any, n: int, where: str) -> tuple[Any, Any]:
    """(context, candidate) of a rollout whose first ``n`` frames are its context (a ``Clip`` or a path)."""
    if isinstance(candidate, BaseException):
        return None, candidate
    if not isinstance(candidate, Clip):
        from ..video.decode import decode_frames

        try:
            frames, fps = decode_frames(candidate)
        except InputError as e:
            return None, e
        candidate = Clip(frames, fps, name=where)
    total = len(candidate.frames)
    if total <= n:
        return None, InputError(where, f"{total} frames, all of them context (context_frames={n}); no candidate is left")
    head, tail = candidate.frames[:n], candidate.frames[n:]
    if n == 1:  # an image context: the frame an image-to-video policy generated from
        context: Any = head[0].cpu().numpy() if is_tensor(head) else head[0]
    else:
        context = Clip(head, candidate.fps, name=f"{where} (context)")
    return context, Clip(tail, candidate.fps, name=where)


def build_call(rule: ContextRule, prompts: Sequence[Any], metas: Sequence[Any], candidates: Sequence[Any], *, prompt_name: str) -> Call:
    """One trainer call's items, contexts found by ``rule``, checked as every RL adapter checks them."""
    cands = list(candidates)
    if rule.context_frames:
        pairs = [split_leading(c, rule.context_frames, f"video {i}") for i, c in enumerate(cands)]
        contexts = [ctx for ctx, _ in pairs]
        cands = [cand for _, cand in pairs]
        name = f"the first {rule.context_frames} frame(s) of each video"
    else:
        contexts = [_lookup(rule, p, m, i) for i, (p, m) in enumerate(zip(prompts, metas))]
        name = rule.where
    # an item whose video or context hook failed keeps that message (not "no context")
    failed = {i: str(v) for i, v in enumerate(cands) if isinstance(v, BaseException)}
    failed.update({i: str(c) for i, c in enumerate(contexts) if isinstance(c, BaseException)})
    contexts = [None if isinstance(c, BaseException) else c for c in contexts]
    call = check_items(prompts, contexts, cands, prompt_name=prompt_name, context_name=name, no_context=rule.no_context)
    for i, message in failed.items():
        if call.errors.get(i, "").startswith(f"item {i}: no context"):  # the context is missing because of this failure
            call.errors[i] = message
    return call


def _lookup(rule: ContextRule, prompt: Any, meta: Any, i: int) -> Any:
    try:
        return rule.lookup(prompt, meta)
    except Exception as e:  # noqa: BLE001 - a context hook that fails fails its item, with its message
        return InputError(f"context for item {i}", f"{rule.where} raised {type(e).__name__}: {e}")
