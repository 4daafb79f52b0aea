"""Training settings: one frozen object, recorded next to every checkpoint and export."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VISION_LORA_TARGETS = ("qkv", "proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    batch_pairs: int = 4
    """Pairs per micro-batch (each pair is two sequences)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    lr: float = 2e-4
    """Learning rate of the LoRA weights."""
    head_lr: float | None = None
    """Learning rate of the reward head (default: ``lr``)."""
    weight_decay: float = 0.0
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = LORA_TARGETS
    lora_vision: bool = False
    """Also put LoRA adapters on the vision tower (attention and MLP projections, patch embedding)."""
    tie_margin: float | None = None
    """Rao-Kupper tau; default 0 (plain Bradley-Terry) without ties, ln 2 with ties."""
    seed: int = 0
    save_every: int = 50
    """Optimizer steps between checkpoints (and one at the end of each epoch)."""
    eval_every: int | None = None
    """Optimizer steps between held-out evaluations (default: end of each epoch)."""
    keep_checkpoints: int = 2
    dtype: str | None = None
    """Training dtype of the backbone; default float32 on CPU, bfloat16 on CUDA."""
    cache_inputs: bool = True
    """Keep encoded pairs in memory across epochs (small datasets)."""
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = {
            "epochs": self.epochs >= 1,
            "batch_pairs": self.batch_pairs >= 1,
            "grad_accum": self.grad_accum >= 1,
            "lr": self.lr > 0 and math.isfinite(self.lr),
            "lora_rank": self.lora_rank >= 1,
            "lora_alpha": self.lora_alpha > 0,
            "warmup_steps": self.warmup_steps >= 0,
            "save_every": self.save_every >= 1,
            "keep_checkpoints": self.keep_checkpoints >= 1,
            "tie_margin": self.tie_margin is None or self.tie_margin >= 0,
            "dtype": self.dtype in (None, "float32", "bfloat16", "float16"),
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} is out of range")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        return d
