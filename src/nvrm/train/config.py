"""Training settings: one frozen object, recorded next to every checkpoint and export."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from .._fields import meta as _help

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VISION_LORA_TARGETS = ("qkv", "proj", "linear_fc1", "linear_fc2")




@dataclass(frozen=True)
class TrainConfig:
    """How ``nvrm train`` fine-tunes (``nvrm train``'s flags are generated from these fields)."""

    epochs: int = field(default=3, metadata=_help("passes over the training pairs"))
    batch_pairs: int = field(
        default=4,
        metadata=_help("pairs per micro-batch across all ranks (each pair is two sequences); split between the ranks, "
                       "so the global batch is the same at any world size"),
    )
    grad_accum: int = field(default=1, metadata=_help("micro-batches per optimizer step (gradients are exchanged between ranks once per step)"))
    lr: float = field(default=2e-4, metadata=_help("learning rate of the LoRA weights"))
    head_lr: float | None = field(default=None, metadata=_help("learning rate of the reward head (default: --lr)"))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay of the LoRA weights"))
    warmup_steps: int = field(default=10, metadata=_help("linear warm-up steps before the cosine decay"))
    max_grad_norm: float = field(default=1.0, metadata=_help("gradient clipping norm (0: no clipping)"))
    lora_rank: int = field(default=16, metadata=_help("LoRA rank"))
    lora_alpha: float = field(default=32.0, metadata=_help("LoRA alpha"))
    lora_dropout: float = field(default=0.0, metadata=_help("LoRA dropout"))
    lora_targets: tuple[str, ...] = field(
        default=LORA_TARGETS,
        metadata=_help("language-model modules that get adapters (repeatable; default all projections)", flag="--lora-target", repeat=True),
    )
    lora_vision: bool = field(default=False, metadata=_help("also put LoRA adapters on the vision tower's projections"))
    tie_margin: float | None = field(default=None, metadata=_help("Rao-Kupper tau; default 0 (plain Bradley-Terry) without ties, ln 2 with ties"))
    seed: int = field(default=0, metadata=_help("seed of the data order and the adapters"))
    save_every: int = field(default=50, metadata=_help("optimizer steps between checkpoints (and one at each epoch end)"))
    eval_every: int | None = field(default=None, metadata=_help("optimizer steps between held-out evaluations (default: each epoch end)"))
    keep_checkpoints: int = field(default=2, metadata=_help("checkpoints kept on disk"))
    dtype: str | None = field(
        default=None, metadata=_help("training dtype of the backbone; default float32 on CPU, bfloat16 on CUDA", choices=("float32", "bfloat16", "float16"))
    )
    cache_inputs: bool = field(default=False, metadata=_help("keep every pair's prepared videos in memory (small data only; large sets use --store)"))
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata=_help("recompute vision blocks and text layers in the backward pass (less memory, same gradients); default on with CUDA",
                       flag="--gradient-checkpointing"),
    )
    optimizer: str = field(default="adamw", metadata=_help("adamw, or sgd (plain gradient steps: what a gradient check compares)", choices=("adamw", "sgd")))
    stop_after_steps: int | None = field(default=None, metadata=_help("stop (with a checkpoint) after this many optimizer steps in all; --resume continues"))

    def __post_init__(self) -> None:
        if not self.lora_targets:
            object.__setattr__(self, "lora_targets", LORA_TARGETS)
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
            "optimizer": self.optimizer in ("adamw", "sgd"),
            "stop_after_steps": self.stop_after_steps is None or self.stop_after_steps >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} is out of range")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        return d
