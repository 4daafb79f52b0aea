"""What a run trains, set up on the loaded base model: LoRA adapters (peft) on the language model (and on the vision
tower with ``lora_vision``), the whole reward head in float32, and the optimizer over both. Everything else stays
frozen."""

from __future__ import annotations

from typing import Sequence

import torch

from ..forward.model import RewardHead
from .config import VISION_LORA_TARGETS, TrainConfig


def trainable_head(rm, device: torch.device) -> RewardHead:
    """A float32 copy of ``rm``'s reward head on ``device``, with gradients."""
    w, b = rm.head.weight, rm.head.bias
    head = RewardHead(w.detach().float().reshape(1, w.shape[-1]), None if b is None else b.detach().float(), torch.float32).to(device)
    head.requires_grad_(True)
    return head


def add_lora(rm, cfg: TrainConfig) -> list[str]:
    """Wrap the backbone's language model (and its vision tower with ``lora_vision``) in LoRA adapters, in place;
    returns the names of the wrapped parts (what checkpoints and the export read back)."""
    from peft import LoraConfig, get_peft_model

    adapted = ["language_model"] + (["visual"] if cfg.lora_vision else [])
    targets = {"language_model": cfg.lora_targets, "visual": VISION_LORA_TARGETS}
    for name in adapted:
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=list(targets[name]), bias="none")
        setattr(rm.backbone, name, get_peft_model(getattr(rm.backbone, name), lora))
    return adapted


def make_optimizer(cfg: TrainConfig, lora_params: Sequence[torch.nn.Parameter], head: RewardHead) -> torch.optim.Optimizer:
    """SGD or AdamW over two groups: the adapters (``lr``, ``weight_decay``) and the head (``head_lr``, no decay)."""
    head_lr = cfg.head_lr if cfg.head_lr is not None else cfg.lr
    groups = [{"params": list(lora_params), "lr": cfg.lr, "weight_decay": cfg.weight_decay},
              {"params": list(head.parameters()), "lr": head_lr, "weight_decay": 0.0}]
    return torch.optim.SGD(groups) if cfg.optimizer == "sgd" else torch.optim.AdamW(groups)
