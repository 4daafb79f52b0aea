"""The forward side of a loaded model: encoded items in, raw rewards out.

``ForwardRuntime`` holds the backbone, the head, the vision tower wrapper and the device, and runs
the three shapes of work the scoring API needs: one batch (packed, split in half on CUDA out of
memory), many items in token-budgeted batches, and a shared-context group (prefix KV per total
length, then suffixes). It knows nothing of files, contracts or results.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from .batching import plan_batches
from .model import RewardHead, collate, enable_packing, forward_rewards
from .prefix import Prefix, prefill, score_suffixes
from .readout import Tap
from .vision import VisionEncoder

log = logging.getLogger("nvrm")


class ForwardRuntime:
    """Backbone + head on one device, with the vision tower's batched path and packed batches when they apply."""

    def __init__(self, backbone, head: RewardHead, *, device: torch.device, codec: Any, pad_id: int, max_batch_tokens: int, normalize_hidden: bool = False):
        self.backbone = backbone
        self.head = head
        self.device = device
        self.codec = codec
        self.pad_id = pad_id
        self.max_batch_tokens = max_batch_tokens
        self.normalize_hidden = normalize_hidden
        attn = getattr(backbone.visual.config, "_attn_implementation", "sdpa")
        self.packed = enable_packing(backbone)
        """Batches run packed (``nvrm.forward.model``): on with plain SDPA attention."""
        self.vision = VisionEncoder(backbone.visual, "eager" if attn == "eager" else "sdpa")
        """The vision tower with nvrm's tables and batched attention (eager's arithmetic under ``eager``)."""

    def tap(self) -> Tap:
        """A fresh ``Tap`` for this backbone: pass it to ``batched`` or ``group`` to keep what the guard reads."""
        return Tap(int(self.backbone.config.vision_config.spatial_merge_size))

    def rewards(self, encoded: Sequence[Any], head: RewardHead | None = None, tap: Tap | None = None) -> torch.Tensor:
        """Raw rewards [B] of encoded items as one batch (no gradient mode is set: the trainer's path too)."""
        batch = collate(encoded, self.pad_id).to(self.device)
        return forward_rewards(
            self.backbone,
            head if head is not None else self.head,
            batch,
            vision=self.vision,
            codec=self.codec,
            normalize_hidden=self.normalize_hidden,
            tap=tap,
        )

    @torch.inference_mode()
    def forward(self, encoded: Sequence[Any], tap: Tap | None = None) -> list[float]:
        """Rewards for encoded items in one batch, split in half on CUDA out-of-memory (``tap``: item i as row i)."""
        try:
            rewards = self.rewards(encoded, tap=tap)
        except torch.OutOfMemoryError:
            if len(encoded) == 1:
                raise
            torch.cuda.empty_cache()
            half = len(encoded) // 2
            log.warning("out of memory on a batch of %d; retrying as %d + %d", len(encoded), half, len(encoded) - half)
            n = len(encoded)
            return self.forward(encoded[:half], _view(tap, range(half))) + self.forward(encoded[half:], _view(tap, range(half, n)))
        return [float(r) for r in rewards.float().cpu()]

    def batched(self, encoded: Sequence[Any], *, exact: bool, tap: Tap | None = None) -> list[float]:
        """Rewards for many items: token-budgeted batches, or one at a time with ``exact``; input order (``tap``: item i as row i)."""
        rewards: list[float] = [0.0] * len(encoded)
        lengths = [e.num_tokens for e in encoded]
        plan = [[i] for i in range(len(encoded))] if exact else plan_batches(lengths, self.max_batch_tokens)
        for rows in plan:
            for i, r in zip(rows, self.forward([encoded[i] for i in rows], _view(tap, rows))):
                rewards[i] = r
        return rewards

    def group(self, enc: Any, prefix: Prefix | None, tap: Tap | None = None) -> tuple[list[float], Prefix]:
        """Rewards of a group's candidates against its shared prefix (reused when it matches); the prefix used
        (``tap``: candidate g as row g)."""
        if prefix is None or not prefix.matches(enc):
            prefix = Prefix.of(enc)
        kw = {"device": self.device, "vision": self.vision, "normalize_hidden": self.normalize_hidden, "tap": tap}
        done = {r: prefill(self.backbone, self.head, prefix, enc, r, **kw) for r in prefix.missing(enc)}
        rewards = score_suffixes(self.backbone, self.head, prefix, enc, max_batch_tokens=self.max_batch_tokens, done=done, **kw)
        return rewards, prefix


def _view(tap: Tap | None, rows) -> Tap | None:
    return None if tap is None else tap.view(list(rows))
