"""Train NVRM-style reward models: Bradley-Terry (with ties) on preference pairs, LoRA, export.

It imports the scoring library (same preprocessing code path); the library never imports it.
"""

from .config import TrainConfig

__all__ = ["TrainConfig"]
