"""``RewardModel``: the scoring API over a loaded bundle.

It joins three parts and adds the results: loading (``nvrm.scoring.loading``), the preprocessing engine
(``nvrm.engine``) that prepares items and groups, the streaming that keeps the engine ahead of the
model (``nvrm.scoring.streaming``), and the forward (``nvrm.forward.runtime``).

    rm = RewardModel.from_pretrained("artifacts/WORL-NVRM")
    rm.score("a prompt", "context.mp4", "candidate.mp4").reward
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..contract import Contract
from ..engine import Engine, PreparedItem, RopeSpec
from ..forward.model import RewardHead
from ..forward.runtime import ForwardRuntime
from ..guard.trust import Guard
from ..video.inputs import PreparedVideo, VideoInput
from .items import Errors, GroupLike, ItemLike, RankEntry, ScoreItem, bt_probability, rank_rewards  # noqa: F401 - part of this module's API
from ..limits import Limits
from .loading import default_batch_tokens, default_device, load_parts, resolve_settings  # noqa: F401 - default_device is API
from ..settings import LoadSettings
from .streaming import Pipeline, ResultMaker, off_contract_reasons  # noqa: F401 - off_contract_reasons is API
from .verbs import Scoring

if TYPE_CHECKING:
    from .differentiable import DifferentiableReward

BACKENDS = ("nvrm", "vllm")
"""What ``from_pretrained(backend=...)`` accepts: nvrm's own engine, or vLLM's pooling runner behind nvrm's contract."""


def load_backend(backend: str, path_or_repo: Any, settings: LoadSettings, contract: Contract | None, vllm_url: str | None = None):
    """A model on another backend than nvrm's engine (``backend="vllm"``: ``nvrm.scoring.vllm_model``)."""
    from ..errors import ConfigError

    if backend != "vllm":
        raise ConfigError(f"backend={backend!r} must be one of {', '.join(BACKENDS)}")
    if settings.members or settings.member_rate:
        asked = "members=True" if settings.members else f"member_rate={settings.member_rate:g}"
        raise ConfigError(f"{asked}: the vLLM backend reads no hidden state, so it has no guard and no members; use backend='nvrm'")
    from .vllm_model import VllmRewardModel

    return VllmRewardModel.load(path_or_repo, settings, contract, url=vllm_url)

Prepared = PreparedItem  # the name earlier releases exported


class RewardModel(Scoring):
    """A loaded WORL-NVRM bundle: backbone, reward head, the preprocessing engine and the contract."""

    def __init__(
        self,
        backbone,
        head: RewardHead,
        processor,
        contract: Contract,
        *,
        device: torch.device,
        revision: str | None = None,
        path: Path | None = None,
        settings: LoadSettings | None = None,
        engine: Engine | None = None,
        guard: Guard | None = None,
        members: Sequence[tuple[str, Any, RewardHead, Any]] = (),
    ):
        from ..bundle import preprocessing_fingerprint

        self.settings = settings or LoadSettings()
        self.processor = processor
        self.contract = contract
        self.device = device
        self.revision = revision
        self.path = path
        self._owns_engine = engine is None
        self.engine = engine or Engine(
            processor,
            contract,
            RopeSpec.from_config(backbone.config),
            workers=self.settings.workers,
            kind=self.settings.worker_kind,  # type: ignore[arg-type]
            limits=self.settings.limits,
        )
        tok = processor.tokenizer
        self.runtime = ForwardRuntime(
            backbone,
            head,
            device=device,
            codec=self.engine.codec,
            pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
            max_batch_tokens=self.settings.max_batch_tokens or default_batch_tokens(device, backbone.config),
            normalize_hidden=contract.normalize_hidden,
        )
        self.fingerprint = preprocessing_fingerprint(path, contract) if path is not None else contract.fingerprint
        """Fingerprint of the preprocessing: the contract plus the bundle's processor, tokenizer and
        template files. Every result records it (``ScoreResult.contract``); rewards are comparable
        only when it agrees."""
        from ..guard.members import Member

        rt = self.runtime
        runtimes = tuple(
            Member(name, ForwardRuntime(b, h, device=device, codec=self.engine.codec, pad_id=rt.pad_id, max_batch_tokens=rt.max_batch_tokens,
                                        normalize_hidden=contract.normalize_hidden), cal.scale, cal.shift, cal.margin)
            for name, b, h, cal in members
        )
        self.pipeline = Pipeline(self.engine, self.runtime, ResultMaker(self.fingerprint, revision, contract), self.settings, guard, members=runtimes)
        """What every scoring path runs on (``nvrm.scoring.streaming``)."""

    @property
    def guard(self) -> Guard | None:
        """The bundle's guard (``nvrm_guard.safetensors``): every result then carries an ``uncertainty``; None without one."""
        return self.pipeline.guard

    @guard.setter
    def guard(self, value: Guard | None) -> None:
        """Use another guard (or none) from now on; one fitted for other weights or preprocessing is refused."""
        import dataclasses

        from ..guard.sidecar import guard_for

        self.pipeline = dataclasses.replace(self.pipeline, guard=guard_for(value, self.path, self.fingerprint, self.device))

    def watch(self, settings: Any = None) -> Any:
        """Keep rolling statistics of every item this model scores from now on, against its guard's reference
        (``nvrm.guard.Monitor``; ``settings``: a ``MonitorSettings``); returns the monitor (``.snapshot()``: ok or suspect)."""
        import dataclasses

        from ..guard.monitor import Monitor

        monitor = Monitor.for_guard(self.guard, settings)
        self.pipeline = dataclasses.replace(self.pipeline, monitor=monitor)
        return monitor

    @property
    def members(self) -> tuple:
        """The members loaded with ``members=True`` or a ``member_rate`` (``nvrm.guard.members``): the guard's opt-in
        check; empty otherwise. Only ``members=True`` puts them in every result's uncertainty and in ``differentiable()``."""
        return self.pipeline.members

    @property
    def monitor(self) -> Any:
        """The monitor ``watch`` started, or None."""
        return self.pipeline.monitor

    @property
    def revision(self) -> str | None:
        """The bundle's revision, recorded in every result."""
        return self._revision

    @revision.setter
    def revision(self, value: str | None) -> None:
        """Name another revision (an export's); results from now on record it."""
        import dataclasses

        self._revision = value
        if hasattr(self, "pipeline"):
            self.pipeline = dataclasses.replace(self.pipeline, results=dataclasses.replace(self.pipeline.results, revision=value))

    backbone = property(lambda self: self.runtime.backbone, doc="The Qwen3-VL backbone (``Qwen3VLModel``).")
    head = property(lambda self: self.runtime.head, doc="The scalar reward head.")
    vision = property(lambda self: self.runtime.vision, doc="The batched vision tower wrapper (None when it does not apply).")
    packed = property(lambda self: self.runtime.packed, doc="Whether batches run packed (``nvrm.forward.model``).")

    max_batch_tokens = property(lambda self: self.runtime.max_batch_tokens, lambda self, v: setattr(self.runtime, "max_batch_tokens", v),
                                doc="Key positions one forward may hold (rows x longest row); settable for later forwards.")

    @property
    def limits(self) -> Limits:
        """The input limits this model enforces (from the load settings; see :class:`nvrm.limits.Limits`)."""
        return self.settings.limits

    # ------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike,
        revision: str | None = None,
        device: str | torch.device | None = None,
        dtype: "torch.dtype | str | None" = None,
        verify: bool | None = None,
        *,
        contract: Contract | None = None,
        settings: LoadSettings | None = None,
        attn_implementation: str | None = None,
        backend: str = "nvrm", vllm_url: str | None = None,
        **overrides: Any,
    ) -> "RewardModel":
        """Load a bundle directory (or Hub repo id at ``revision``), verifying it by default.

        Args:
            path_or_repo: bundle directory, or a Hub repo id such as ``Efficient-Large-Model/WORL-NVRM``.
            revision, device, dtype, verify: shortcuts for the ``LoadSettings`` fields of those names.
            contract: use this contract instead of the bundle's (release default + ``nvrm_contract.json``).
            settings: every other setting (``max_batch_tokens``, ``workers``, ``compile``, ``exact`` ...);
                keyword ``overrides`` replace single fields of it.
            backend, vllm_url: ``"vllm"``: vLLM behind nvrm's contract, in process or at ``vllm_url`` (``nvrm.scoring.vllm_model``).

        Returns:
            A ready ``RewardModel``; call ``close()`` (or use it as a context manager) to stop its workers.
        """
        shortcuts = {"revision": revision, "verify": verify, "attention": attn_implementation, "device": device, "dtype": dtype}
        s = resolve_settings(settings, shortcuts, overrides)
        return cls(**load_parts(path_or_repo, s, contract)) if backend == "nvrm" else load_backend(backend, path_or_repo, s, contract, vllm_url)

    def close(self) -> None:
        """Stop the preprocessing workers (the weights stay usable for direct forwards)."""
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> "RewardModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ preprocessing

    def prepare_video(self, value: VideoInput, role: str) -> PreparedVideo:
        """The contract for one context or candidate: the exact frames the model sees."""
        return self.engine.prepare(value, role)

    # ------------------------------------------------------------ the model

    def rewards(self, encoded: Sequence[Any], head: RewardHead | None = None) -> torch.Tensor:
        """Raw rewards [B] of engine-encoded items as one batch, no gradient mode set (the trainer's path; ``head``: its own)."""
        return self.runtime.rewards(encoded, head)

    def differentiable(self, *, checkpointing: bool = True, conservative: float | None = None) -> "DifferentiableReward":
        """A ``torch.nn.Module`` whose rewards backpropagate to candidate pixels, equal to ``score``'s (``nvrm.scoring.differentiable``);
        with ``conservative=λ``, ``reward - λ * uncertainty`` (needs a guard)."""
        from .differentiable import DifferentiableReward
        return DifferentiableReward(self, checkpointing=checkpointing, conservative=conservative)

    def info(self) -> dict[str, Any]:
        """What is loaded and how it runs (path, revision, device, dtype, contract, engine)."""
        return {
            "path": str(self.path) if self.path else None, "revision": self.revision,
            "device": str(self.device),
            "dtype": str(self.backbone.dtype).replace("torch.", ""),
            "contract": self.contract.fingerprint,
            "preprocessing": self.fingerprint,
            "chat_template": getattr(self.processor, "_nvrm_template_source", "processor"),
            "max_batch_tokens": self.max_batch_tokens,
            "workers": {"count": self.engine.workers, "kind": self.engine.kind},
            "pixel_codec": self.engine.codec is not None, "packed_batches": self.packed,
        }
