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
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import torch

from ..contract import Contract
from ..engine import Engine, PreparedGroup, PreparedItem, RopeSpec
from ..errors import NvrmError
from ..forward.model import RewardHead
from ..forward.prefix import Prefix
from ..forward.runtime import ForwardRuntime
from ..video.inputs import PreparedVideo, VideoInput
from .items import Errors, GroupLike, ItemLike, RankEntry, ScoreItem, bt_probability, rank_rewards  # noqa: F401 - part of this module's API
from ..limits import Limits
from .loading import default_batch_tokens, default_device, load_parts, resolve_settings  # noqa: F401 - default_device is API
from ..results import ScoreResult
from ..settings import LoadSettings
from .streaming import Pipeline, ResultMaker, off_contract_reasons, score_chunk, score_prepared_each, stream_batch, stream_groups  # noqa: F401 - off_contract_reasons is API

if TYPE_CHECKING:
    from .differentiable import DifferentiableReward

BACKENDS = ("nvrm", "vllm")
"""What ``from_pretrained(backend=...)`` accepts: nvrm's own engine, or vLLM's pooling runner behind nvrm's contract."""


def load_backend(backend: str, path_or_repo: Any, settings: LoadSettings, contract: Contract | None, vllm_url: str | None = None):
    """A model on another backend than nvrm's engine (``backend="vllm"``: ``nvrm.scoring.vllm_model``)."""
    from ..errors import ConfigError

    if backend != "vllm":
        raise ConfigError(f"backend={backend!r} must be one of {', '.join(BACKENDS)}")
    from .vllm_model import VllmRewardModel

    return VllmRewardModel.load(path_or_repo, settings, contract, url=vllm_url)

Prepared = PreparedItem  # the name earlier releases exported


class RewardModel:
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
        self.pipeline = Pipeline(self.engine, self.runtime, ResultMaker(self.fingerprint, revision, contract), self.settings)
        """What every scoring path runs on (``nvrm.scoring.streaming``)."""

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

    def prepare(self, prompt: str, context: VideoInput, candidate: VideoInput) -> PreparedItem:
        """Apply the contract to one item: sample, transform and encode its frames (blocking)."""
        return self.engine.prepare_item(prompt, context, candidate)

    def prepare_video(self, value: VideoInput, role: str) -> PreparedVideo:
        """The contract for one context or candidate: the exact frames the model sees."""
        return self.engine.prepare(value, role)

    # ------------------------------------------------------------ the model

    def rewards(self, encoded: Sequence[Any], head: RewardHead | None = None) -> torch.Tensor:
        """Raw rewards [B] of engine-encoded items as one batch, no gradient mode set (the trainer's path; ``head``: its own)."""
        return self.runtime.rewards(encoded, head)

    def differentiable(self, *, checkpointing: bool = True) -> "DifferentiableReward":
        """A ``torch.nn.Module`` whose rewards backpropagate to candidate pixels, equal to ``score``'s (``nvrm.scoring.differentiable``)."""
        from .differentiable import DifferentiableReward
        return DifferentiableReward(self, checkpointing=checkpointing)

    def score_prepared(self, prepared: Sequence[PreparedItem], *, exact: bool | None = None) -> list[ScoreResult]:
        """Score prepared items in token-budgeted batches (or one by one with ``exact``); input order."""
        return self.pipeline.score_prepared(prepared, exact=exact)

    def score_prepared_each(self, prepared: Sequence[PreparedItem], *, exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """``score_prepared`` that never fails as a whole: a batch that fails unexpectedly is retried item by
        item, and what still fails is an error in its slot."""
        return score_prepared_each(self.pipeline, prepared, exact=exact)

    # ------------------------------------------------------------ scoring

    def score(self, prompt: str, context: VideoInput, candidate: VideoInput) -> ScoreResult:
        """Reward for one (prompt, context, candidate)."""
        prepared = self.prepare(prompt, context, candidate)
        self.limits.check_sequence_tokens(prepared.encoded.num_tokens)
        result = self.score_prepared([prepared], exact=True)[0]
        if isinstance(result, NvrmError):  # a non-finite reward: never returned as a result
            raise result
        return result

    def score_batch(self, items: Iterable[ItemLike], *, errors: Errors = "raise", exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """Rewards for many items, batched by token budget; results in input order.

        Args:
            items: ``ScoreItem``s, ``(prompt, context, candidate)`` triples or dicts with those keys.
            errors: ``"return"`` puts a bad item's error in its slot and scores the rest;
                ``"raise"`` raises the first bad item's error.
            exact: score every item alone: bit-identical to ``score`` (on the CPU, packed batches are too).

        Returns:
            One ``ScoreResult`` (or, with ``errors="return"``, ``NvrmError``) per item.
        """
        return stream_batch(self.pipeline, items, errors=errors, exact=exact)

    def score_group(
        self, prompt: str, context: VideoInput, candidates: Sequence[VideoInput], *, errors: Errors = "raise", exact: bool | None = None
    ) -> list[ScoreResult | NvrmError]:
        """Rewards for G candidates sharing one prompt and context (GRPO groups).

        The context is preprocessed and encoded by the vision tower once; one candidate of each
        length runs whole, keeping the prefix's KV, and the others run only their own tokens
        against it (chunks of ``group_chunk`` candidates for big groups, the prefix reused across
        chunks). On the CPU this equals ``score`` bit for bit (README, "Fidelity"); ``exact=True``
        scores each candidate alone instead. A bad context raises; a bad candidate raises or, with
        ``errors="return"``, yields its error in its slot.
        """
        [out] = list(stream_groups(self.pipeline, [(prompt, context, candidates)], errors=errors, exact=exact, lookahead=0, context_raises=True))
        return out

    def score_groups(
        self, groups: Iterable[GroupLike], *, errors: Errors = "return", exact: bool | None = None, lookahead: int | None = None
    ) -> Iterator[list[ScoreResult | NvrmError]]:
        """Score a stream of groups, preparing the next ones while the current one is on the model.

        Args:
            groups: ``(prompt, context, candidates)`` tuples (or dicts), consumed lazily.
            errors: ``"return"`` (default) puts errors in their slots (a bad
                context fills every slot of its group); ``"raise"`` raises the first.
            exact: score every candidate alone (see ``score_group``).
            lookahead: groups prepared ahead of the one being scored (default: the ``lookahead`` setting).

        Yields:
            One list per group, in order, one ``ScoreResult`` or ``NvrmError`` per candidate.
        """
        return stream_groups(self.pipeline, groups, errors=errors, exact=exact, lookahead=lookahead)

    def score_prepared_group(self, group: PreparedGroup, *, exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """Results for a group the engine prepared: one per candidate slot, errors in their slots."""
        results, _ = self.score_chunk(group, None, self.settings.exact if exact is None else exact)
        return results

    def score_prepared_group_reusing(self, group: PreparedGroup, prefix: Prefix | None) -> tuple[list[ScoreResult | NvrmError], Prefix | None]:
        """Like :meth:`score_prepared_group` (not exact), reusing ``prefix`` when it is this group's.

        Returns the results and the prefix that was used (``prefix`` itself, extended, or a new one;
        None when no candidate could run), so a caller can keep it for later candidates of the same
        prompt and context."""
        return self.score_chunk(group, prefix, False)

    def score_chunk(self, group: PreparedGroup, prefix: Prefix | None, exact: bool) -> tuple[list[ScoreResult | NvrmError], Prefix | None]:
        """Score the good candidates of a prepared group (reusing ``prefix`` when it matches): the results
        in candidate order and the prefix used (``nvrm.scoring.streaming.score_chunk``)."""
        return score_chunk(self.pipeline, group, prefix, exact)

    def compare(self, prompt: str, context: VideoInput, a: VideoInput, b: VideoInput) -> float:
        """P(a preferred over b) under the Bradley-Terry model: sigmoid(r_a - r_b)."""
        ra, rb = self.score_group(prompt, context, [a, b])
        return bt_probability(ra.reward, rb.reward)  # type: ignore[union-attr]

    def rank(self, prompt: str, context: VideoInput, candidates: Sequence[VideoInput]) -> list[RankEntry]:
        """Candidates sorted best first (ties keep input order), each with its result and Bradley-Terry probabilities."""
        results = self.score_group(prompt, context, candidates)
        return rank_rewards([r.reward for r in results], results)  # type: ignore[union-attr,arg-type]

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
