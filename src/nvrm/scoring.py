"""RewardModel: the public scoring API.

    rm = RewardModel.from_pretrained("artifacts/WORL-NVRM")
    rm.score(prompt, context, candidate).reward      # raw BF16 logit as float
    rm.compare(prompt, context, a, b)                # P(a preferred) = sigmoid(r_a - r_b)
    rm.rank(prompt, context, [c1, c2, c3])           # best first
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, Union

import torch

from .batching import plan_batches
from .bundle import load_backbone, load_head, load_processor, read_config, resolve_bundle, verify_bundle
from .contract import Contract
from .errors import InputError, NvrmError
from .group import encode_group, forward_group
from .inputs import PreparedVideo, VideoInput, prepare_input
from .pipeline import PrepPool
from .model import DTYPES, RewardHead, collate, forward_rewards, position_ids
from .prompt import Encoded, encode

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_TOKENS = 16384


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["context_times"] = list(self.context_times)
        d["candidate_times"] = list(self.candidate_times)
        return d


@dataclass(frozen=True)
class ScoreItem:
    """One (prompt, context, candidate) triple for ``score_batch``."""

    prompt: str
    context: Any
    candidate: Any


@dataclass(frozen=True)
class RankEntry:
    index: int
    """Position of the candidate in the input list."""
    rank: int
    """1 = best."""
    result: ScoreResult

    @property
    def reward(self) -> float:
        return self.result.reward


@dataclass(frozen=True)
class Prepared:
    """One item after the contract: frames, model inputs and their provenance."""

    context: PreparedVideo
    candidate: PreparedVideo
    encoded: Encoded = field(repr=False)


ItemLike = Union[ScoreItem, Sequence[Any], Mapping[str, Any]]


def _as_item(item: ItemLike, i: int) -> ScoreItem:
    if isinstance(item, ScoreItem):
        return item
    if isinstance(item, Mapping):
        missing = [k for k in ("prompt", "context", "candidate") if k not in item]
        if missing:
            raise InputError(f"item {i}", f"missing field(s) {', '.join(missing)}")
        return ScoreItem(item["prompt"], item["context"], item["candidate"])
    if isinstance(item, (tuple, list)) and len(item) == 3:
        return ScoreItem(*item)
    raise InputError(f"item {i}", "expected ScoreItem, (prompt, context, candidate) or a dict with those keys")


def bt_probability(r_a: float, r_b: float) -> float:
    """Bradley-Terry P(a preferred over b) = sigmoid(r_a - r_b)."""
    d = r_a - r_b
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class RewardModel:
    """A loaded WORL-NVRM bundle: backbone, reward head, processor and contract."""

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
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        workers: int | None = None,
    ):
        self.backbone = backbone
        self.head = head
        self.processor = processor
        self.contract = contract
        self.device = device
        self.revision = revision
        self.path = path
        self.max_batch_tokens = max_batch_tokens
        self.pool = PrepPool(workers)
        # Each thread tokenises and normalises with its own processor copy (the
        # fast tokenizer must not be shared across threads); the template is
        # only ever read, under the lock, to make those copies.
        self._template = copy.deepcopy(processor)
        self._template_lock = threading.Lock()
        self._local = threading.local()
        self.pad_id = processor.tokenizer.pad_token_id if processor.tokenizer.pad_token_id is not None else 0

    # ------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike,
        revision: str | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
        verify: bool = True,
        *,
        contract: Contract | None = None,
        attn_implementation: str | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        workers: int | None = None,
        compile: bool | str = False,
    ) -> "RewardModel":
        """Load a bundle directory (or Hub repo id at ``revision``), verifying it by default.

        ``compile=True`` wraps the language model in ``torch.compile`` (dynamic
        shapes); a string picks the compile mode (e.g. ``"max-autotune"``). The
        first calls at new shapes pay the compilation time.
        """
        path = resolve_bundle(path_or_repo, revision)
        report = verify_bundle(path) if verify else None
        config = read_config(path)
        contract = contract or Contract.for_bundle(path)
        device = torch.device(device) if device is not None else default_device()
        attn = attn_implementation or _default_attention(device)
        backbone = load_backbone(path, config, dtype, attn)
        weight, bias = load_head(path, config.text_config.hidden_size)
        head = RewardHead(weight, bias, DTYPES[contract.head_dtype])
        processor = load_processor(path)
        model_revision = report.revision if report else _manifest_revision(path)
        backbone.to(device)
        head.to(device)
        if compile:
            mode = compile if isinstance(compile, str) else None
            backbone.language_model.compile(dynamic=True, mode=mode)
        return cls(
            backbone,
            head,
            processor,
            contract,
            device=device,
            revision=model_revision or revision,
            path=path,
            max_batch_tokens=max_batch_tokens,
            workers=workers,
        )

    # ------------------------------------------------------------ preprocessing

    def prepare(self, prompt: str, context: VideoInput, candidate: VideoInput) -> Prepared:
        """Apply the contract to one item: sample, transform and encode its frames."""
        return self._encode(prompt, self._frames(prompt, context, candidate))

    def _frames(self, prompt: str, context: VideoInput, candidate: VideoInput) -> tuple[PreparedVideo, PreparedVideo]:
        """The thread-safe part of ``prepare``: decoding and the per-frame contract."""
        if not isinstance(prompt, str):
            raise InputError("prompt", f"must be a string, got {type(prompt).__name__}")
        return prepare_input(context, "context", self.contract), prepare_input(candidate, "candidate", self.contract)

    def _processor(self):
        """This thread's own copy of the processor."""
        proc = getattr(self._local, "processor", None)
        if proc is None:
            with self._template_lock:
                proc = copy.deepcopy(self._template)
            self._local.processor = proc
        return proc

    def _encode(self, prompt: str, frames: tuple[PreparedVideo, PreparedVideo]) -> Prepared:
        ctx, cand = frames
        return Prepared(ctx, cand, encode(self._processor(), prompt, ctx.images, cand.images, self.contract))

    def _prepare_item(self, item: "ScoreItem | NvrmError") -> "Prepared | NvrmError":
        """Pool job: the whole contract for one item, errors returned in place."""
        if isinstance(item, NvrmError):
            return item
        try:
            return self.prepare(item.prompt, item.context, item.candidate)
        except NvrmError as e:
            return e

    # ------------------------------------------------------------ scoring

    def _result(self, prepared: Prepared, reward: float) -> ScoreResult:
        return ScoreResult(
            reward=reward,
            context_times=prepared.context.times,
            candidate_times=prepared.candidate.times,
            num_tokens=prepared.encoded.num_tokens,
            contract=self.contract.fingerprint,
            model_revision=self.revision,
        )

    @torch.inference_mode()
    def _forward(self, encoded: Sequence[Encoded]) -> list[float]:
        """Rewards for already-encoded items, split in half on CUDA out-of-memory."""
        cpu_batch = collate(encoded, self.pad_id)
        positions = position_ids(self.backbone, cpu_batch)
        batch = cpu_batch.to(self.device, non_blocking=True)
        try:
            rewards = forward_rewards(
                self.backbone, self.head, batch, positions=positions, normalize_hidden=self.contract.normalize_hidden
            )
        except torch.OutOfMemoryError:
            if len(encoded) == 1:
                raise
            torch.cuda.empty_cache()
            half = len(encoded) // 2
            log.warning("out of memory on a batch of %d; retrying as %d + %d", len(encoded), half, len(encoded) - half)
            return self._forward(encoded[:half]) + self._forward(encoded[half:])
        return [float(r) for r in rewards.float().cpu()]

    def score_prepared(self, prepared: Sequence[Prepared]) -> list[ScoreResult]:
        """Score prepared items in token-budgeted batches; results in input order."""
        rewards: list[float | None] = [None] * len(prepared)
        lengths = [p.encoded.num_tokens for p in prepared]
        for group in plan_batches(lengths, self.max_batch_tokens):
            out = self._forward([prepared[i].encoded for i in group])
            for i, r in zip(group, out):
                rewards[i] = r
        return [self._result(p, r) for p, r in zip(prepared, rewards)]  # type: ignore[arg-type]

    def score(self, prompt: str, context: VideoInput, candidate: VideoInput) -> ScoreResult:
        """Reward for one (prompt, context, candidate)."""
        return self.score_prepared([self.prepare(prompt, context, candidate)])[0]

    def score_batch(
        self, items: Iterable[ItemLike], *, errors: Literal["raise", "return"] = "raise"
    ) -> list[ScoreResult | NvrmError]:
        """Rewards for many items, batched by token budget; results in input order.

        With ``errors="return"`` a bad item yields its error in its slot and the
        rest are still scored; with ``"raise"`` the first bad item raises.
        """
        items = list(items)
        parsed: list[Any] = []
        for i, raw in enumerate(items):
            try:
                parsed.append(_as_item(raw, i))
            except NvrmError as e:
                if errors == "raise":
                    raise
                parsed.append(e)
        # The whole contract (decode, per-frame work, tokenise, normalise) runs
        # ahead in the pool while earlier windows are on the model.
        futures = self.pool.map_ordered(self._prepare_item, parsed)
        out: list[Any] = [None] * len(items)
        window = max(8, 4 * max(1, self.pool.workers))
        for start in range(0, len(items), window):
            good: list[tuple[int, Prepared]] = []
            for i in range(start, min(start + window, len(items))):
                prepared = futures[i].result()
                if isinstance(prepared, NvrmError):
                    if errors == "raise":
                        for f in futures[i:]:
                            f.cancel()
                        raise prepared
                    out[i] = prepared
                else:
                    good.append((i, prepared))
            for (slot, _), result in zip(good, self.score_prepared([p for _, p in good])):
                out[slot] = result
        return out

    def score_group(
        self,
        prompt: str,
        context: VideoInput,
        candidates: Sequence[VideoInput],
        *,
        errors: Literal["raise", "return"] = "raise",
    ) -> list[ScoreResult | NvrmError]:
        """Rewards for G candidates sharing one prompt and context (GRPO groups).

        The context is preprocessed, encoded by the vision tower and prefilled
        through the language model once; the candidates then run as one batch
        against that cached prefix. Equal to ``score`` per candidate up to
        floating-point reduction order. A bad context raises; a bad candidate
        raises or, with ``errors="return"``, yields its error in its slot.
        """
        if not isinstance(prompt, str):
            raise InputError("prompt", f"must be a string, got {type(prompt).__name__}")
        # already-prepared candidates (e.g. from the service) need no pool round trip
        futures = [
            _done(c) if isinstance(c, PreparedVideo) else self.pool.submit(prepare_input, c, "candidate", self.contract)
            for c in candidates
        ]
        try:
            ctx = prepare_input(context, "context", self.contract)
        except NvrmError:
            for f in futures:
                f.cancel()
            raise
        out: list[Any] = []
        good: list[tuple[int, PreparedVideo]] = []
        for f in futures:
            try:
                good.append((len(out), f.result()))
                out.append(None)
            except NvrmError as e:
                if errors == "raise":
                    raise
                out.append(e)
        if not good:
            return out
        enc = encode_group(self._processor(), prompt, ctx.images, [p.images for _, p in good], self.contract)
        rewards = forward_group(
            self.backbone,
            self.head,
            enc,
            pad_id=self.pad_id,
            device=self.device,
            max_batch_tokens=self.max_batch_tokens,
            normalize_hidden=self.contract.normalize_hidden,
        )
        for (slot, cand), seq, reward in zip(good, enc.ids, rewards):
            out[slot] = ScoreResult(
                reward=reward,
                context_times=ctx.times,
                candidate_times=cand.times,
                num_tokens=int(seq.shape[0]),
                contract=self.contract.fingerprint,
                model_revision=self.revision,
            )
        return out

    def compare(self, prompt: str, context: VideoInput, a: VideoInput, b: VideoInput) -> float:
        """P(a preferred over b) under the Bradley-Terry model: sigmoid(r_a - r_b)."""
        ra, rb = self.score_group(prompt, context, [a, b])
        return bt_probability(ra.reward, rb.reward)  # type: ignore[union-attr]

    def rank(self, prompt: str, context: VideoInput, candidates: Sequence[VideoInput]) -> list[RankEntry]:
        """Candidates sorted best first (ties keep input order)."""
        results = self.score_group(prompt, context, candidates)
        order = sorted(range(len(results)), key=lambda i: -results[i].reward)  # type: ignore[union-attr]
        return [RankEntry(i, r + 1, results[i]) for r, i in enumerate(order)]  # type: ignore[arg-type]

    def info(self) -> dict[str, Any]:
        return {
            "path": str(self.path) if self.path else None,
            "revision": self.revision,
            "device": str(self.device),
            "dtype": str(self.backbone.dtype).replace("torch.", ""),
            "contract": self.contract.fingerprint,
        }


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def _default_attention(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def _manifest_revision(path: Path) -> str | None:
    from .bundle import read_manifest

    try:
        m = read_manifest(path)
    except NvrmError:
        return None
    return m.revision if m else None
