"""A score or an error, and the one place it becomes a dict or an output row.

Torch-free: the HTTP client and the batch output use it without loading a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class ScoreResult:
    """One reward and what produced it."""

    reward: float
    """Raw last-token logit of the reward head (bfloat16 value as a float). Higher = preferred."""
    context_times: tuple[float, ...]
    """Source times (s) of the context frames the model saw."""
    candidate_times: tuple[float, ...]
    """Source times (s) of the candidate frames the model saw."""
    num_tokens: int
    """Sequence length of the model input."""
    contract: str
    """Fingerprint of the preprocessing contract used."""
    model_revision: str | None
    """Bundle revision from its manifest, if recorded."""
    off_contract: tuple[str, ...] = ()
    """Why this reward is not the release contract's (an opt-in such as a short candidate was used); empty when it is."""
    uncertainty: float | None = None
    """How far to trust ``reward``, in reward units: the part of it the bundle's guard puts in doubt (higher = less
    trustworthy; ``nvrm.guard``). None when the bundle has no guard."""
    frame_stats: Mapping[str, float] | None = field(default=None, repr=False, compare=False)
    """Cheap statistics of the candidate frames the model saw (brightness, saturation, contrast, sharpness, texture,
    change; ``nvrm.guard.stats``), read with the uncertainty; what the rollout monitor follows. None without a guard."""

    def conservative(self, weight: float) -> float:
        """``reward - weight * uncertainty``: the reward to optimise when the policy may game it (needs a guard)."""
        from .guard.conservative import conservative_reward

        return conservative_reward(self.reward, self.uncertainty, weight)

    def to_dict(self) -> dict[str, Any]:
        """Every field, times as lists (JSON-ready)."""
        d = asdict(self)
        d["context_times"] = list(self.context_times)
        d["candidate_times"] = list(self.candidate_times)
        d["off_contract"] = list(self.off_contract)
        return d


@dataclass(frozen=True)
class VllmScoreResult(ScoreResult):
    """A ``ScoreResult`` computed by vLLM (``backend="vllm"``): never exact, and it says how many of the prompt's
    tokens vLLM took from its prefix cache."""

    backend: str = "vllm"
    exact: bool = False
    cached_tokens: int = 0
    """Prompt tokens vLLM read from its prefix cache for this item (a group's later candidates share the context's)."""


def one_line(e: BaseException) -> str:
    """An error's message on one line; unexpected ones say so."""
    from .errors import InternalError, NvrmError

    return str(e) if isinstance(e, NvrmError) else str(InternalError.wrap(e))


def error_code(e: BaseException) -> str:
    """The stable code of an item error: contract_violation, limit_exceeded, invalid_input, internal,
    the service's own (shutting_down, timeout), or error."""
    from .errors import ContractError, InputError, InternalError, LimitError, NvrmError, Unavailable

    if isinstance(e, Unavailable):
        return e.code
    if isinstance(e, ContractError):
        return "contract_violation"
    if isinstance(e, LimitError):
        return "limit_exceeded"
    if isinstance(e, InternalError) or not isinstance(e, NvrmError):
        return "internal"
    if isinstance(e, InputError):
        return "invalid_input"
    return "error"


def item_dict(result: "ScoreResult | BaseException", conservative: float | None = None) -> dict[str, Any]:
    """What the service returns per item: the reward fields (with ``conservative``, also ``reward - conservative *
    uncertainty`` as ``conservative_reward``), or ``{"error": {"code", "message"}}``."""
    if isinstance(result, BaseException):
        return {"error": {"code": error_code(result), "message": one_line(result)}}
    if conservative is not None and result.uncertainty is not None:
        return {**item_dict(result), "conservative_reward": result.conservative(conservative)}
    return {
        "reward": result.reward,
        "num_tokens": result.num_tokens,
        "context_times": list(result.context_times),
        "candidate_times": list(result.candidate_times),
        **({"off_contract": list(result.off_contract)} if result.off_contract else {}),
        **({"uncertainty": result.uncertainty} if result.uncertainty is not None else {}),
        **({"backend": result.backend, "cached_tokens": result.cached_tokens} if isinstance(result, VllmScoreResult) else {}),
    }


def result_row(row: Any, index: int, result: "ScoreResult | BaseException", meta: dict[str, Any]) -> dict[str, Any]:
    """One batch output row for candidate ``index`` of manifest ``row`` (reward or a one-line error)."""
    out = {
        "id": row.id,
        "candidate_index": int(index),
        "candidate": row.labels[index] if index < len(row.labels) else "",
        "reward": None,
        "error": None,
        "num_tokens": None,
        "contract": meta["contract"],
        "model_revision": meta["model_revision"],
        "off_contract": None,
        "uncertainty": None,
        "input_key": row.input_key(index) if hasattr(row, "input_key") else None,
    }
    if isinstance(result, BaseException):
        out["error"] = one_line(result)
    else:
        out["reward"] = result.reward
        out["num_tokens"] = result.num_tokens
        out["off_contract"] = "; ".join(getattr(result, "off_contract", ())) or None  # the opt-ins this reward used, if any
        out["uncertainty"] = getattr(result, "uncertainty", None)
    return out
