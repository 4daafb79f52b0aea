"""How a guard is fitted: the settings (``nvrm guard fit``'s flags) and the fit's fixed draws. Torch-free, so the
command line builds its flags without loading a model; the fit itself is ``nvrm.train.fit_guard``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._fields import meta as _help
from ..errors import ConfigError

MIN_PAIRS = 16
"""Fewest usable pairs a guard is fitted from."""
BUDGETS = (4, 8, 16, 32)
"""L-infinity budgets (0..255 levels) of the fit's attackers."""
STEPS = (4, 8, 16)
"""Step counts of the fit's attackers (each step a quarter of the budget)."""


@dataclass(frozen=True)
class GuardFitSettings:
    """How a guard is fitted (``nvrm guard fit``'s flags are generated from these fields)."""

    attacks: int = field(default=96, metadata=_help("candidates hacked for the fit per round (more: a better fit, a longer one)"))
    adaptive_rounds: int = field(default=1, metadata=_help("rounds of attackers that ascend the conservative reward of the guard fitted so far"))
    conservative: float = field(default=1.0, metadata=_help("λ of the adaptive attackers' objective reward - λ x uncertainty"))
    holdout: float = field(default=0.2, metadata=_help("share of the examples (contexts) kept out of the fit to measure it first"))
    seed: int = field(default=0, metadata=_help("seed of every draw (examples held out, attackers, budgets)"))
    batch: int = field(default=8, metadata=_help("candidates hacked together (one forward and backward per step)"))

    def __post_init__(self) -> None:
        problems = []
        if self.attacks < 8:
            problems.append(f"attacks={self.attacks} must be >= 8")
        if self.adaptive_rounds < 0:
            problems.append(f"adaptive_rounds={self.adaptive_rounds} must be >= 0")
        if not 0 <= self.holdout < 0.9:
            problems.append(f"holdout={self.holdout} must be in [0, 0.9)")
        if not self.conservative >= 0:
            problems.append(f"conservative={self.conservative} must be >= 0")
        if self.batch < 1:
            problems.append(f"batch={self.batch} must be >= 1")
        if problems:
            raise ConfigError("invalid guard fit settings: " + "; ".join(problems))
