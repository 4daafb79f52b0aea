"""How far to trust a reward: the guard, the conservative reward, the rollout monitor (docs/hacking.md).

- ``Guard`` (``trust.py``): from what a score's one forward computed, an ``uncertainty`` in reward units;
  ``reward - λ * uncertainty`` is the conservative reward;
- ``nvrm.train.fit_guard`` fits one for a bundle from preference pairs (training: it attacks the model); ``write_bundle_guard``
  stores it beside the release's files as ``nvrm_guard.safetensors`` (listed in the manifest), where ``RewardModel`` finds it;
- members (``members.py``): the opt-in check, other reward models stored in the bundle (``nvrm guard member``) and run on every
  item when a model is loaded with ``members=True``; the uncertainty is then the larger of the guard's and the members' doubt;
- ``Monitor`` (``monitor.py``): rolling statistics of scored items and whether they look like reward hacking.

Only ``trust``, ``reading``, ``stats`` and ``members`` run while scoring; nothing here imports the server or a trainer.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Guard": "trust", "GUARD_FILE": "trust", "load_guard": "trust",
    "GuardFitSettings": "fit_settings",
    "write_bundle_guard": "sidecar", "read_bundle_guard": "sidecar",
    "Monitor": "monitor", "MonitorSettings": "monitor",
    "check_conservative": "conservative",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nvrm.guard' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
