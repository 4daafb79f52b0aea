"""nvrm: runtime for the WORL-NVRM next-video reward model.

    from nvrm import RewardModel, Clip
    rm = RewardModel.from_pretrained("artifacts/WORL-NVRM")
    rm.score("a prompt", "context.mp4", "candidate.mp4").reward
"""

from .contract import RELEASE_CONTRACT, Contract
from .errors import BundleError, ContractError, InputError, IntegrityError, NvrmError
from .inputs import Clip
from .rewardfn import RewardFnError, make_reward_fn
from .scoring import RewardModel, ScoreResult

__version__ = "0.1.0"
__all__ = [
    "RewardModel",
    "ScoreResult",
    "make_reward_fn",
    "RewardFnError",
    "Clip",
    "Contract",
    "RELEASE_CONTRACT",
    "NvrmError",
    "InputError",
    "ContractError",
    "BundleError",
    "IntegrityError",
]
