"""``nvrm refresh``: one cycle of refreshing the reward model from the policy's own rollouts.

``plan`` (the stages, their fingerprints, what to resume; pure), ``cycle`` (``run_cycle``: the folder and the
walk), ``cycle_stages`` (what each stage does), ``gate`` (the checks before anything is exported). docs/refresh.md.
"""

from .cycle import CycleResult, RefreshConfig, run_cycle

__all__ = ["CycleResult", "RefreshConfig", "run_cycle"]
