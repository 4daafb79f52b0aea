"""How a model is loaded and run: one frozen object, one default and one meaning per setting.

``RewardModel.from_pretrained``, the CLI, the service, the Ray actor and the
trainer all build a ``LoadSettings``; the CLI's model flags are generated
from its fields (``cli/options.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .limits import Limits
from ._fields import meta as _help
from .contract import DTYPE_NAMES

MAX_WORKERS = 256
"""More preprocessing workers than this is a mistake (each holds a processor; processes fork)."""
ATTENTION_NAMES = ("sdpa", "flash_attention_2", "eager")
WORKER_KINDS = ("auto", "thread", "process")




@dataclass(frozen=True)
class LoadSettings:
    """Settings for loading and running a bundle (the contract itself lives in the bundle)."""

    revision: str | None = field(default=None, metadata=_help("Hub revision (commit sha) to pin when the model is a repo id"))
    device: str | None = field(default=None, metadata=_help("torch device; default cuda when available, else cpu"))
    dtype: str = field(default="bfloat16", metadata=_help("backbone dtype", choices=DTYPE_NAMES))
    verify: bool = field(default=True, metadata=_help("check every file against the bundle's manifest", flag="--no-verify"))
    max_batch_tokens: int | None = field(
        default=None,
        metadata=_help(
            "key positions one forward pass may hold: rows x the longest row's attended length "
            "(a group suffix attends to its prefix too); default 16384 on CPU, sized to free memory on CUDA",
            flag="--batch-tokens",
        ),
    )
    workers: int | None = field(default=None, metadata=_help("preprocessing workers; default one per core (at most 16)"))
    worker_kind: str = field(
        default="auto",
        metadata=_help("preprocessing workers as threads or processes; auto: threads up to 4 workers", choices=WORKER_KINDS),
    )
    compile: bool | str = field(default=False, metadata=_help("torch.compile the language model (optionally a mode)"))
    attention: str | None = field(
        default=None, metadata=_help("attention implementation; default flash_attention_2 on CUDA when installed, else sdpa", choices=ATTENTION_NAMES)
    )
    exact: bool = field(
        default=False,
        metadata=_help("score every item alone (no padding, no prefix reuse): bit-identical to score(), slower"),
    )
    lookahead: int = field(default=2, metadata=_help("groups prepared ahead of the one on the model (score_groups)"))
    group_chunk: int = field(default=64, metadata=_help("candidates of one group prepared and scored per chunk"))
    vllm_timeout_s: float = field(
        default=60.0,
        metadata=_help("with --vllm-url: the longest wait for the vLLM server's answer to one request; past it that request's "
                       "items get 503 backend_unavailable, and the service's other requests are not held behind it"),
    )
    members: bool = field(
        default=False,
        metadata=_help("also run the bundle's members (nvrm_members/, the guard's opt-in check): each item's uncertainty becomes the larger of "
                       "the guard's and what the members put in doubt; one more forward per member and item"),
    )
    member_rate: float = field(
        default=0.0,
        metadata=_help("without --members: run the bundle's members on this share of the scoring calls (a batch, or a group's chunk) "
                       "for the monitor only (its 'members' entry; the results keep the guard's uncertainty); about this share of "
                       "--members' extra cost, spent only while a monitor watches (the service's, or RewardModel.watch)"),
    )
    limits: Limits = field(default_factory=Limits, metadata=_help("bounds checked before any work", cli=False))

    def __post_init__(self) -> None:
        problems = []
        if self.dtype not in DTYPE_NAMES:
            problems.append(f"dtype={self.dtype!r} must be one of {', '.join(DTYPE_NAMES)}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            problems.append(f"max_batch_tokens={self.max_batch_tokens} must be >= 1")
        if self.workers is not None and not 0 <= self.workers <= MAX_WORKERS:
            problems.append(f"workers={self.workers} must be in 0..{MAX_WORKERS}")
        if self.worker_kind not in WORKER_KINDS:
            problems.append(f"worker_kind={self.worker_kind!r} must be one of {', '.join(WORKER_KINDS)}")
        if self.attention is not None and self.attention not in ATTENTION_NAMES:
            problems.append(f"attention={self.attention!r} must be one of {', '.join(ATTENTION_NAMES)}")
        if self.lookahead < 0:
            problems.append(f"lookahead={self.lookahead} must be >= 0")
        if self.group_chunk < 1:
            problems.append(f"group_chunk={self.group_chunk} must be >= 1")
        if not (isinstance(self.vllm_timeout_s, (int, float)) and 0 < self.vllm_timeout_s <= 86400):
            problems.append(f"vllm_timeout_s={self.vllm_timeout_s!r} must be a number of seconds in (0, 86400]")
        if isinstance(self.member_rate, bool) or not (isinstance(self.member_rate, (int, float)) and 0 <= self.member_rate <= 1):
            problems.append(f"member_rate={self.member_rate!r} must be a share in [0, 1]")
        elif self.members and self.member_rate:
            problems.append(f"member_rate={self.member_rate!r} with members=True: the members already run on every item; drop one of the two")
        if not isinstance(self.limits, Limits):
            problems.append(f"limits must be a Limits, got {type(self.limits).__name__}")
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

    def replace(self, **changes: Any) -> "LoadSettings":
        """A copy with ``changes`` (unknown names are a ConfigError)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **changes)
