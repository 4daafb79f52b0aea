"""Qwen3-VL's 3-D multimodal RoPE positions, owned by nvrm (the release's arithmetic, transformers 4.57.6).

The language model sees each token at a (t, h, w) position. Text tokens advance all three
together; the merged patches of an image sit at ``(0, row, col)`` offset by the text before it,
and the text after an image resumes one past the largest position used so far. transformers
computes this in the private ``Qwen3VLModel.get_rope_index``, whose signature and helpers
changed in 5.x; the positions are integers, so this module reproduces 4.57.6's exactly
(``tests/unit/test_rope.py`` holds it to the installed transformers where their calls agree).

nvrm passes every frame as an image (a temporal pair of one frame), so sequences hold images
only: a video token in ``ids`` is refused.

Shapes: L tokens, I images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeSpec:
    """The config numbers the positions depend on (picklable: the engine's workers carry it)."""

    spatial_merge_size: int
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int

    @classmethod
    def from_config(cls, config) -> "RopeSpec":
        return cls(
            int(config.vision_config.spatial_merge_size),
            int(config.image_token_id),
            int(config.video_token_id),
            int(config.vision_start_token_id),
        )

    def positions(self, ids: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """[3, L] int64 positions of one unpadded sequence ``ids`` [L] with image grids [I, 3]."""
        return rope_index(ids, grids, self)


def rope_index(ids: torch.Tensor, grids: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    """[3, L] positions of ``ids`` [L] whose images (in order) have patch grids ``grids`` [I, 3] (pure)."""
    tokens = ids.tolist()
    starts = [i for i, t in enumerate(tokens[:-1]) if t == spec.vision_start_token_id]
    following = [tokens[i + 1] for i in starts]
    if spec.video_token_id in following:
        raise ValueError("the sequence holds a video; nvrm encodes every frame as an image")
    n_images = sum(1 for t in following if t == spec.image_token_id)
    if n_images != int(grids.shape[0]):
        raise ValueError(f"the sequence holds {n_images} images for {int(grids.shape[0])} image grids")
    m = spec.spatial_merge_size
    blocks: list[torch.Tensor] = []
    next_pos = 0  # one past the largest position so far
    st = 0
    for t, h, w in grids.tolist():
        ed = tokens.index(spec.image_token_id, st)
        text_len = ed - st
        if text_len:
            blocks.append(torch.arange(text_len).view(1, -1).expand(3, -1) + next_pos)
        gt, gh, gw = int(t), int(h) // m, int(w) // m
        t_index = torch.arange(gt).view(-1, 1).expand(-1, gh * gw).flatten()
        h_index = torch.arange(gh).view(1, -1, 1).expand(gt, -1, gw).flatten()
        w_index = torch.arange(gw).view(1, 1, -1).expand(gt, gh, -1).flatten()
        image = torch.stack([t_index, h_index, w_index]) + text_len + next_pos
        blocks.append(image)
        next_pos = int(image.max()) + 1
        st = ed + gt * gh * gw
    if st < len(tokens):
        blocks.append(torch.arange(len(tokens) - st).view(1, -1).expand(3, -1) + next_pos)
    return torch.cat(blocks, dim=1).to(torch.long) if blocks else torch.zeros((3, 0), dtype=torch.long)
