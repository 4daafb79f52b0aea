"""The engine's jobs: module-level functions ``job(state, *args)`` a worker runs.

A job raises ``NvrmError`` for a bad input; the engine puts it in that
input's slot. The sequence-token limit is applied here, where a sequence's
length is first known (``item_job``, ``refuse_long_rows``), and nowhere
downstream: what the engine hands on is within it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence


from PIL import Image

from ..errors import NvrmError
from ..limits import Limits
from ..video.inputs import PreparedVideo, prepare_input
from .chat import check_prompt, images_kwargs
from .encode import Encoded, GroupEncoded, encode_group, encode_item
from .workers import WorkerState


_BLANK = Image.new("RGB", (32, 32))


@dataclass(frozen=True)
class PreparedItem:
    """One (prompt, context, candidate) after the contract and encoding."""

    context: PreparedVideo
    candidate: PreparedVideo
    encoded: Encoded = field(repr=False)
    prompt: str = ""
    """The prompt the text was built from (what a backend that renders its own text needs)."""


def encode_video(state: WorkerState, video: PreparedVideo) -> PreparedVideo:
    """Attach the vision input (codec patches, or the processor's pixel values)."""
    if video.encoded:
        return video
    if not video.images:  # the no-context opt-in: zero rows of the layout one frame would have
        one = encode_video(state, dataclasses.replace(video, images=(_BLANK,)))
        return dataclasses.replace(video, pixels=one.pixels[:0], grid=one.grid[:0])
    if state.codec is not None:
        pixels, grid = state.codec.encode(video.images)
    else:
        out = state.processor.image_processor(
            images=list(video.images), return_tensors="pt", **images_kwargs(state.contract)
        )
        pixels, grid = out["pixel_values"], out["image_grid_thw"]
    return dataclasses.replace(video, pixels=pixels, grid=grid)


def video_job(state: WorkerState, value: Any, role: str) -> PreparedVideo:
    """The contract for one context or candidate, encoded."""
    return encode_video(state, prepare_input(value, role, state.contract, state.limits))


def item_job(state: WorkerState, prompt: str, context: Any, candidate: Any) -> PreparedItem:
    """The whole contract for one item: both videos, the text and the positions."""
    check_prompt(state.processor, prompt, state.limits)
    ctx = video_job(state, context, "context")
    cand = video_job(state, candidate, "candidate")
    enc = encode_item(
        state.processor, state.rope, prompt, (ctx.pixels, ctx.grid), (cand.pixels, cand.grid), state.contract, state.codec
    )
    state.limits.check_sequence_tokens(enc.num_tokens)
    return PreparedItem(ctx, cand, enc, prompt)


def group_job(state: WorkerState, prompt: str, context: PreparedVideo, candidates: Sequence[PreparedVideo]) -> GroupEncoded:
    """Token ids and positions for a group whose videos are prepared."""
    check_prompt(state.processor, prompt, state.limits)
    return encode_group(
        state.processor,
        state.rope,
        prompt,
        (context.pixels, context.grid),
        [(c.pixels, c.grid) for c in candidates],
        state.contract,
        state.codec,
    )


def refuse_long_rows(limits: Limits, encoded: GroupEncoded, slots: Sequence[int]) -> tuple[GroupEncoded | None, dict[int, NvrmError]]:
    """A group's sequences held to the sequence-token limit: (the group without the rows over it, or None when
    none is left; {slot: its refusal}). Row ``r`` of ``encoded`` is candidate ``slots[r]``; nothing is re-encoded."""
    refused: dict[int, NvrmError] = {}
    for ids, slot in zip(encoded.ids, slots):
        try:
            limits.check_sequence_tokens(int(ids.shape[0]), f"candidate {slot}")
        except NvrmError as e:
            refused[slot] = e
    if not refused:
        return encoded, refused
    rows = [r for r, slot in enumerate(slots) if slot not in refused]
    return (encoded.select(rows) if rows else None), refused
