"""Prepared frames + prompt -> model inputs (token ids, 3-D positions, pixels).

Pure functions of their arguments; the engine runs them in its workers.

- Text: the chat layout is rendered with the bundle's template, each image
  slot is expanded to one ``<|image_pad|>`` per merged patch (what the
  processor does), and the text is tokenised with the bundle's tokenizer.
- Positions: Qwen3-VL's 3-D multimodal RoPE positions (``nvrm.forward.rope``:
  the release's arithmetic, owned by nvrm), computed here per sequence from
  token ids, image grids and four config numbers, so the thread that drives
  the model never walks tokens in Python.
- Pixels: the codec's uint8 patches (normalised on the device later), or the
  processor's float32 values when no exact codec exists.

Shapes: L tokens, P prefix tokens, S suffix tokens, N patches, I images.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..contract import Contract
from .chat import render
from ..forward.pixels import to_pixel_values  # noqa: F401 - the engine's callers find it here
from ..forward.rope import RopeSpec
from .codec import PixelCodec


@dataclass(frozen=True)
class Encoded:
    """Model inputs for one item."""

    input_ids: torch.Tensor  # [L] int64
    positions: torch.Tensor  # [3, L] int64
    pixels: torch.Tensor  # [N, D]: uint8 codec patches, or float32 pixel values
    image_grid_thw: torch.Tensor  # [I, 3] int64
    codec: PixelCodec | None = field(default=None, repr=False)
    """How ``pixels`` become pixel values (None: they already are)."""
    candidate_images: int = 0
    """How many of the images, the last ones, are the candidate's (the rest are the context's)."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def pixel_values(self) -> torch.Tensor:
        """float32 [N, C*T*ps*ps], exactly what the bundle's processor produces."""
        return to_pixel_values(self.pixels, self.codec)


@dataclass(frozen=True)
class GroupEncoded:
    """Model inputs for G candidates sharing a prefix; ``ids[g]`` is candidate g's full sequence."""

    ids: list[torch.Tensor]  # G x [P + S_g]
    positions: list[torch.Tensor]  # G x [3, P + S_g]
    prefix_len: int  # P
    context_pixels: torch.Tensor  # [N_ctx, D]
    context_grid: torch.Tensor  # [n_ctx, 3]
    candidate_pixels: list[torch.Tensor]  # G x [N_g, D]
    candidate_grids: list[torch.Tensor]  # G x [n_g, 3]
    codec: PixelCodec | None = field(default=None, repr=False)

    def suffix(self, g: int) -> torch.Tensor:
        return self.ids[g][self.prefix_len :]

    @classmethod
    def from_items(
        cls, rope: RopeSpec, n_context: int, context: tuple[torch.Tensor, torch.Tensor], items: Sequence["Encoded"],
        candidates: Sequence[tuple[torch.Tensor, torch.Tensor]],
    ) -> "GroupEncoded | None":
        """A group made of separately encoded items that share their prompt and context (no re-tokenising);
        None if their sequences do not share the context prefix after all."""
        first = items[0]
        starts = (first.input_ids == rope.vision_start_token_id).nonzero().flatten()
        if len(starts) <= n_context:
            return None
        P = int(starts[n_context])
        for it in items[1:]:
            if not (torch.equal(it.input_ids[:P], first.input_ids[:P]) and torch.equal(it.positions[:, :P], first.positions[:, :P])):
                return None
        return cls(
            [it.input_ids for it in items],
            [it.positions for it in items],
            P,
            context[0],
            context[1],
            [c[0] for c in candidates],
            [c[1] for c in candidates],
            first.codec,
        )

    def select(self, rows: Sequence[int]) -> "GroupEncoded":
        """The same group with only candidates ``rows`` (in that order)."""
        return GroupEncoded(
            [self.ids[r] for r in rows],
            [self.positions[r] for r in rows],
            self.prefix_len,
            self.context_pixels,
            self.context_grid,
            [self.candidate_pixels[r] for r in rows],
            [self.candidate_grids[r] for r in rows],
            self.codec,
        )




def expand_image_tokens(text: str, grids: torch.Tensor, image_token: str, merge: int) -> str:
    """What the processor does to the text: one image token per merged patch."""
    parts = text.split(image_token)
    if len(parts) - 1 != grids.shape[0]:
        raise ValueError(f"template has {len(parts) - 1} image slots for {grids.shape[0]} images")
    counts = (grids.prod(-1) // (merge * merge)).tolist()
    return parts[0] + "".join(image_token * n + rest for n, rest in zip(counts, parts[1:]))


def tokenize(processor, text: str) -> torch.Tensor:
    return processor.tokenizer(text, return_tensors="pt", padding=False)["input_ids"][0]


def encode_item(
    processor,
    rope: RopeSpec,
    prompt: str,
    context: tuple[torch.Tensor, torch.Tensor],
    candidate: tuple[torch.Tensor, torch.Tensor],
    contract: Contract,
    codec: PixelCodec | None,
) -> Encoded:
    """One (prompt, context, candidate) from encoded videos ``(pixels, grid)``."""
    (ctx_pixels, ctx_grid), (cand_pixels, cand_grid) = context, candidate
    grids = torch.cat([ctx_grid, cand_grid])
    text = render(processor, prompt, int(ctx_grid.shape[0]), int(cand_grid.shape[0]), contract)
    ids = tokenize(processor, expand_image_tokens(text, grids, processor.image_token, rope.spatial_merge_size))
    return Encoded(ids, rope.positions(ids, grids), torch.cat([ctx_pixels, cand_pixels]), grids, codec, int(cand_grid.shape[0]))


def encode_group(
    processor,
    rope: RopeSpec,
    prompt: str,
    context: tuple[torch.Tensor, torch.Tensor],
    candidates: Sequence[tuple[torch.Tensor, torch.Tensor]],
    contract: Contract,
    codec: PixelCodec | None,
) -> GroupEncoded:
    """Token ids and positions for every full sequence, computed once per distinct candidate shape.

    In an RL group the candidates usually share one resolution, so their
    token sequences are identical: the text is rendered, tokenised and
    positioned once per distinct (frame count, grids), not once per candidate.
    """
    ctx_pixels, ctx_grid = context
    n_ctx = int(ctx_grid.shape[0])
    vision_start = processor.tokenizer.convert_tokens_to_ids(processor.vision_start_token)
    cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
    ids, positions = [], []
    for _, grid in candidates:
        key = tuple(map(tuple, grid.tolist()))
        if key not in cache:
            grids = torch.cat([ctx_grid, grid])
            text = render(processor, prompt, n_ctx, int(grid.shape[0]), contract)
            seq = tokenize(processor, expand_image_tokens(text, grids, processor.image_token, rope.spatial_merge_size))
            cache[key] = (seq, rope.positions(seq, grids))
        seq, pos = cache[key]
        ids.append(seq)
        positions.append(pos)
    # Prefix = everything before the first candidate image's <|vision_start|>.
    prefix_len = int((ids[0] == vision_start).nonzero().flatten()[n_ctx])
    for seq, pos in zip(ids[1:], positions[1:]):
        if not (torch.equal(seq[:prefix_len], ids[0][:prefix_len]) and torch.equal(pos[:, :prefix_len], positions[0][:, :prefix_len])):
            raise RuntimeError("candidate sequences do not share the context prefix")  # pragma: no cover - a template bug
    return GroupEncoded(
        ids,
        positions,
        prefix_len,
        ctx_pixels,
        ctx_grid,
        [p for p, _ in candidates],
        [g for _, g in candidates],
        codec,
    )
