"""``nvrm probe``: does the reward go up for a frozen clip, a reversed one, a copy of the context, a
candidate that ignores the prompt? Check before a week of RL.

    from . import probe
    report = probe(model, prompt, "context.mp4", "candidate.mp4")
    report.flagged          # degradations that scored higher than the original
"""

from .perturbations import PERTURBATIONS, Perturbation, ProbeItem, register
from .suite import Outcome, ProbeReport, probe, probe_many, summarize

__all__ = ["PERTURBATIONS", "Perturbation", "ProbeItem", "register", "probe", "probe_many", "summarize", "Outcome", "ProbeReport"]
