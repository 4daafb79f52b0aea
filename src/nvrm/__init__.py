"""nvrm: runtime for the WORL-NVRM next-video reward model.

    from . import RewardModel, Clip
    rm = RewardModel.from_pretrained("artifacts/WORL-NVRM")
    rm.score("a prompt", "context.mp4", "candidate.mp4").reward

Imports are lazy: ``import nvrm`` (and ``import nvrm.client``) loads neither
torch nor transformers; the first use of ``RewardModel`` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__  # noqa: F401 - the one version (pyprojects read it too)
from .errors import BundleError, ContractError, InputError, IntegrityError, LimitError, NvrmError, RewardFnError

_LAZY = {
    "RewardModel": "scoring.reward_model",
    "ScoreResult": "results",
    "Clip": "clip",
    "Contract": "contract",
    "RELEASE_CONTRACT": "contract",
    "Limits": "limits",
    "LoadSettings": "settings",
    "make_reward_fn": "rl.reward_fn",
}

__all__ = [
    "RewardModel",
    "ScoreResult",
    "make_reward_fn",
    "Clip",
    "Contract",
    "RELEASE_CONTRACT",
    "Limits",
    "LoadSettings",
    "NvrmError",
    "InputError",
    "ContractError",
    "LimitError",
    "BundleError",
    "IntegrityError",
    "RewardFnError",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nvrm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .clip import Clip
    from .contract import RELEASE_CONTRACT, Contract
    from .limits import Limits
    from .results import ScoreResult
    from .rl.reward_fn import make_reward_fn
    from .scoring.reward_model import RewardModel
    from .settings import LoadSettings
