"""The whole reward forward as one ``nn.Module``: what Accelerate / DDP wraps in training.

DDP synchronises gradients from hooks it arms in its own ``forward``; a trainer that called the
backbone's parts directly would bypass it and leave gradients unsynchronised without a word. So
training calls exactly this module: encoded sequences in, float32 rewards out, through the scoring
forward (``nvrm.forward.model.forward_rewards``: the same tokens, positions, vision tower and
last-token readout as ``score``).

With ``checkpointing`` every vision block and text layer recomputes its activations in the backward
pass (the differentiable reward's checkpointed layers, ``nvrm.forward.backprop``): about 0.18 MB per
token instead of 3-4 MB on the 4B model, and the same gradients.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from ..forward.backprop import checkpointed_layers
from ..forward.model import RewardHead, collate, forward_rewards
from ..forward.vision import checkpointing as vision_checkpointing


class RewardForward(nn.Module):
    """``forward(encoded) -> rewards [N]`` (float32, with gradients) of a backbone and a trainable head."""

    def __init__(self, runtime, head: RewardHead, *, checkpointing: bool = False):
        super().__init__()
        self.backbone = runtime.backbone
        self.head = head
        self.checkpointing = checkpointing
        self._runtime = runtime  # device, vision tower wrapper, pixel codec, pad id (not a submodule)

    def forward(self, encoded: Sequence[Any]) -> torch.Tensor:
        rt = self._runtime
        batch = collate(encoded, rt.pad_id).to(rt.device)
        on = self.checkpointing and torch.is_grad_enabled()
        with vision_checkpointing(on), checkpointed_layers(self.backbone.language_model.layers, on):
            rewards = forward_rewards(self.backbone, self.head, batch, vision=rt.vision, codec=rt.codec, normalize_hidden=rt.normalize_hidden)
        return rewards.float()
