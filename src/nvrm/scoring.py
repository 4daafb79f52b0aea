"""RewardModel: the public scoring API.

    rm = RewardModel.from_pretrained("artifacts/WORL-NVRM")
    rm.score(prompt, context, candidate).reward      # raw BF16 logit as float
    rm.score_group(prompt, context, candidates)      # G candidates, one shared context
    for results in rm.score_groups(groups): ...      # a stream of groups, CPU and GPU overlapped
    rm.compare(prompt, context, a, b)                # P(a preferred) = sigmoid(r_a - r_b)
    rm.rank(prompt, context, [c1, c2, c3])           # best first

Inputs are prepared by the model's ``Engine`` (the contract and encoding, in
workers); the calling thread only assembles tensors and runs the model.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, Union

import torch

from .forward.batching import plan_batches
from .bundle import load_backbone, load_head, load_processor, preprocessing_fingerprint, read_config, resolve_bundle, verify_bundle
from .contract import Contract
from .engine import Engine, PreparedGroup, PreparedItem, RopeSpec
from .engine.encode import Encoded, encode_item
from .errors import InputError, InternalError, NvrmError
from .forward.prefix import Prefix, prefill, score_suffixes
from .inputs import PreparedVideo, VideoInput
from .limits import Limits
from .numerics import ensure_cpu_sdpa
from .forward.model import DTYPES, RewardHead, collate, enable_packing, forward_rewards
from .report.ranking import sigmoid
from .results import ScoreResult
from .settings import LoadSettings
from .forward.vision import VisionEncoder

log = logging.getLogger(__name__)

CPU_BATCH_TOKENS = 16384
Prepared = PreparedItem  # the name earlier releases exported


@dataclass(frozen=True)
class ScoreItem:
    """One (prompt, context, candidate) triple for ``score_batch``."""

    prompt: str
    context: Any
    candidate: Any


@dataclass(frozen=True)
class RankEntry:
    """One candidate's place in :meth:`RewardModel.rank` output."""
    index: int
    """Position of the candidate in the input list."""
    rank: int
    """1 = best."""
    result: ScoreResult

    @property
    def reward(self) -> float:
        """The candidate's reward (the raw BF16 logit as a float)."""
        return self.result.reward


ItemLike = Union[ScoreItem, Sequence[Any], Mapping[str, Any]]
GroupLike = Union[tuple, Sequence[Any], Mapping[str, Any]]
Errors = Literal["raise", "return"]


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


def _as_group(group: GroupLike, k: int) -> tuple[str, Any, list[Any]]:
    if isinstance(group, Mapping):
        missing = [key for key in ("prompt", "context", "candidates") if key not in group]
        if missing:
            raise InputError(f"group {k}", f"missing field(s) {', '.join(missing)}")
        prompt, context, candidates = group["prompt"], group["context"], group["candidates"]
    elif isinstance(group, (tuple, list)) and len(group) == 3:
        prompt, context, candidates = group
    else:
        raise InputError(f"group {k}", "expected (prompt, context, candidates) or a dict with those keys")
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
        raise InputError(f"group {k}", "candidates must be a list")
    return prompt, context, list(candidates)


def bt_probability(r_a: float, r_b: float) -> float:
    """Bradley-Terry P(a preferred over b) = sigmoid(r_a - r_b)."""
    return sigmoid(r_a - r_b)


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is visible, else ``cpu``: the device ``from_pretrained`` uses when none is given."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_batch_tokens(device: torch.device, config) -> int:
    """The key-position budget of a forward pass: 16,384 on CPU; on CUDA a quarter of free memory's worth of KV."""
    if device.type != "cuda":
        return CPU_BATCH_TOKENS
    text = config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_bytes = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * 2  # bf16 K and V per position
    free, _ = torch.cuda.mem_get_info(device)
    return int(max(CPU_BATCH_TOKENS, min(262144, free // 4 // kv_bytes)))


class _PendingGroup:
    """A group handed to the engine: its context future, and its candidates in chunks that are
    submitted as they are needed (at most ``CHUNKS_AHEAD`` beyond the one being scored), so a
    group of thousands never has more than a few chunks prepared in memory at once."""

    CHUNKS_AHEAD = 1

    def __init__(self, engine=None, prompt: Any = None, context: Any = None, candidates: Sequence[Any] = (), chunk: int = 1, error: NvrmError | None = None, n: int = 0):
        self.engine = engine
        self.prompt = prompt
        self.candidates = list(candidates)
        self.n = len(self.candidates) if error is None else n
        self.error = error
        self.slots = [list(range(s, min(s + chunk, self.n))) for s in range(0, self.n, chunk)] if error is None else []
        self.futures: list[Future] = []
        self.context = engine.submit_video(context, "context") if error is None else None
        if error is None:
            self.submit_through(0)

    def submit_through(self, k: int) -> None:
        """Make sure chunks 0..k (and those ahead of k) are submitted."""
        while len(self.futures) < min(len(self.slots), k + 1 + self.CHUNKS_AHEAD):
            idx = self.slots[len(self.futures)]
            self.futures.append(self.engine.submit_group(self.prompt, self.context, [self.candidates[i] for i in idx]))

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


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
        self.settings = settings or LoadSettings()
        self.backbone = backbone
        self.head = head
        self.processor = processor
        self.contract = contract
        self.device = device
        self.revision = revision
        self.path = path
        self.max_batch_tokens = self.settings.max_batch_tokens or default_batch_tokens(device, backbone.config)
        attn = getattr(backbone.visual.config, "_attn_implementation", "sdpa")
        self.packed = enable_packing(backbone)
        """Batches run packed (``nvrm.forward.model``): on with plain SDPA attention."""
        self.vision = VisionEncoder(backbone.visual) if attn in ("sdpa", "flash_attention_2") else None
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
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.fingerprint = preprocessing_fingerprint(path, contract) if path is not None else contract.fingerprint
        """Fingerprint of the preprocessing: the contract plus the bundle's processor, tokenizer and
        template files. Every result records it (``ScoreResult.contract``); rewards are comparable
        only when it agrees."""

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
        **overrides: Any,
    ) -> "RewardModel":
        """Load a bundle directory (or Hub repo id at ``revision``), verifying it by default.

        Args:
            path_or_repo: bundle directory, or a Hub repo id such as ``Efficient-Large-Model/WORL-NVRM``.
            revision, device, dtype, verify: shortcuts for the ``LoadSettings`` fields of those names.
            contract: use this contract instead of the bundle's (release default + ``nvrm_contract.json``).
            settings: every other setting (``max_batch_tokens``, ``workers``, ``compile``, ``exact`` ...);
                keyword ``overrides`` replace single fields of it.

        Returns:
            A ready ``RewardModel``; call ``close()`` (or use it as a context manager) to stop its workers.
        """
        settings = settings or LoadSettings()
        shortcuts: dict[str, Any] = {"revision": revision, "verify": verify, "attention": attn_implementation}
        if device is not None:
            shortcuts["device"] = str(device)
        if dtype is not None:
            shortcuts["dtype"] = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
        settings = settings.replace(**{k: v for k, v in {**shortcuts, **overrides}.items() if v is not None})

        path = resolve_bundle(path_or_repo, settings.revision)
        report = verify_bundle(path) if settings.verify else None
        config = read_config(path)
        contract = contract or Contract.for_bundle(path)
        dev = torch.device(settings.device) if settings.device else default_device()
        attn = settings.attention or _default_attention(dev)
        ensure_cpu_sdpa()
        backbone = load_backbone(path, config, DTYPES[settings.dtype], attn)
        weight, bias = load_head(path, config.text_config.hidden_size)
        head = RewardHead(weight, bias, DTYPES[contract.head_dtype])
        processor = load_processor(path)
        model_revision = report.revision if report else _manifest_revision(path)
        backbone.to(dev)
        head.to(dev)
        if settings.compile:
            mode = settings.compile if isinstance(settings.compile, str) else None
            backbone.language_model.compile(dynamic=True, mode=mode)
        return cls(
            backbone,
            head,
            processor,
            contract,
            device=dev,
            revision=model_revision or settings.revision,
            path=path,
            settings=settings,
        )

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

    def _result(self, context: PreparedVideo, candidate: PreparedVideo, num_tokens: int, reward: float) -> ScoreResult:
        return ScoreResult(
            reward=reward,
            context_times=context.times,
            candidate_times=candidate.times,
            num_tokens=num_tokens,
            contract=self.fingerprint,
            model_revision=self.revision,
            off_contract=off_contract_reasons(context, candidate, self.contract),
        )

    def rewards(self, encoded: Sequence[Encoded], head: RewardHead | None = None) -> torch.Tensor:
        """Raw rewards [B] of encoded items as one padded batch (no gradient mode is set: the trainer's path too).

        Args:
            encoded: items from the engine (``PreparedItem.encoded``).
            head: a reward head to use instead of the model's own (the trainer's float32 head).
        """
        batch = collate(encoded, self.pad_id).to(self.device)
        return forward_rewards(
            self.backbone,
            head if head is not None else self.head,
            batch,
            vision=self.vision,
            codec=self.engine.codec,
            normalize_hidden=self.contract.normalize_hidden,
        )

    @torch.inference_mode()
    def _forward(self, encoded: Sequence[Encoded]) -> list[float]:
        """Rewards for already-encoded items in one padded batch, split in half on CUDA out-of-memory."""
        try:
            rewards = self.rewards(encoded)
        except torch.OutOfMemoryError:
            if len(encoded) == 1:
                raise
            torch.cuda.empty_cache()
            half = len(encoded) // 2
            log.warning("out of memory on a batch of %d; retrying as %d + %d", len(encoded), half, len(encoded) - half)
            return self._forward(encoded[:half]) + self._forward(encoded[half:])
        return [float(r) for r in rewards.float().cpu()]

    def _check_length(self, encoded: Encoded) -> None:
        self.limits.check_sequence_tokens(encoded.num_tokens)

    def score_prepared(self, prepared: Sequence[PreparedItem], *, exact: bool | None = None) -> list[ScoreResult]:
        """Score prepared items in token-budgeted batches (or one by one with ``exact``); input order."""
        exact = self.settings.exact if exact is None else exact
        rewards: list[float] = [0.0] * len(prepared)
        lengths = [p.encoded.num_tokens for p in prepared]
        batches = [[i] for i in range(len(prepared))] if exact else plan_batches(lengths, self.max_batch_tokens)
        for rows in batches:
            for i, r in zip(rows, self._forward([prepared[i].encoded for i in rows])):
                rewards[i] = r
        return [self._result(p.context, p.candidate, p.encoded.num_tokens, r) for p, r in zip(prepared, rewards)]

    # ------------------------------------------------------------ scoring

    def score(self, prompt: str, context: VideoInput, candidate: VideoInput) -> ScoreResult:
        """Reward for one (prompt, context, candidate)."""
        return self.score_prepared([self.prepare(prompt, context, candidate)], exact=True)[0]

    def score_batch(
        self, items: Iterable[ItemLike], *, errors: Errors = "raise", exact: bool | None = None
    ) -> list[ScoreResult | NvrmError]:
        """Rewards for many items, batched by token budget; results in input order.

        Args:
            items: ``ScoreItem``s, ``(prompt, context, candidate)`` triples or dicts with those keys.
            errors: ``"return"`` puts a bad item's error in its slot and scores the rest;
                ``"raise"`` raises the first bad item's error.
            exact: score every item alone (no padding): bit-identical to ``score``.

        Returns:
            One ``ScoreResult`` (or, with ``errors="return"``, ``NvrmError``) per item.
        """
        items = list(items)
        out: list[Any] = [None] * len(items)
        window = max(8, 4 * max(1, self.engine.workers))
        pending: deque[tuple[int, Future | NvrmError]] = deque()
        i_next = 0

        def submit_until(limit: int) -> None:
            nonlocal i_next
            while i_next < len(items) and len(pending) < limit:
                try:
                    it = _as_item(items[i_next], i_next)
                    pending.append((i_next, self.engine.submit_item(it.prompt, it.context, it.candidate)))
                except NvrmError as e:
                    pending.append((i_next, e))
                i_next += 1

        # The engine prepares the next windows while this one is on the model.
        submit_until(2 * window)
        while pending:
            good: list[tuple[int, PreparedItem]] = []
            while pending and len(good) < window:
                slot, job = pending.popleft()
                try:
                    prepared = job.result() if isinstance(job, Future) else job
                    if isinstance(prepared, NvrmError):
                        raise prepared
                    self._check_length(prepared.encoded)
                except NvrmError as e:
                    if errors == "raise":
                        for _, f in pending:
                            if isinstance(f, Future):
                                f.cancel()
                        raise
                    out[slot] = e
                except Exception as e:  # noqa: BLE001 - a bug must not pass as a result
                    if errors == "raise":
                        raise
                    out[slot] = InternalError.wrap(e)
                else:
                    good.append((slot, prepared))
            submit_until(2 * window)
            if good:
                for (slot, _), result in zip(good, self.score_prepared([p for _, p in good], exact=exact)):
                    out[slot] = result
        return out

    def score_group(
        self,
        prompt: str,
        context: VideoInput,
        candidates: Sequence[VideoInput],
        *,
        errors: Errors = "raise",
        exact: bool | None = None,
    ) -> list[ScoreResult | NvrmError]:
        """Rewards for G candidates sharing one prompt and context (GRPO groups).

        The context is preprocessed, encoded by the vision tower and prefilled
        through the language model once; the candidates then run in batches
        against that cached prefix (chunks of ``group_chunk`` candidates for big
        groups, the prefix reused across chunks). Equal to ``score`` per
        candidate up to floating-point reduction order (README, "Fidelity");
        ``exact=True`` scores each candidate alone instead. A bad context
        raises; a bad candidate raises or, with ``errors="return"``, yields its
        error in its slot.
        """
        [out] = list(
            self._score_groups([(prompt, context, candidates)], errors=errors, exact=exact, lookahead=0, context_raises=True)
        )
        return out

    def score_groups(
        self,
        groups: Iterable[GroupLike],
        *,
        errors: Errors = "return",
        exact: bool | None = None,
        lookahead: int | None = None,
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
        return self._score_groups(groups, errors=errors, exact=exact, lookahead=lookahead)

    def _score_groups(self, groups, *, errors: Errors, exact: bool | None, lookahead: int | None, context_raises: bool = False):
        ahead = self.settings.lookahead if lookahead is None else lookahead
        it = iter(enumerate(groups))
        pending: deque[_PendingGroup] = deque()

        def fill(limit: int) -> None:
            while len(pending) < limit:
                try:
                    k, group = next(it)
                except StopIteration:
                    return
                pending.append(self._submit_group(group, k))

        fill(ahead + 1)
        try:
            while pending:
                current = pending.popleft()
                fill(ahead)  # groups k+1 .. k+ahead prepare while group k is on the model
                yield self._run_group(current, errors, self.settings.exact if exact is None else exact, context_raises)
        finally:
            for p in pending:
                p.cancel()

    def _submit_group(self, group: GroupLike, k: int) -> _PendingGroup:
        try:
            prompt, context, candidates = _as_group(group, k)
            self.limits.check_group(len(candidates))
        except NvrmError as e:
            n = len(group[2]) if isinstance(group, (tuple, list)) and len(group) == 3 and isinstance(group[2], Sequence) else 0
            return _PendingGroup(error=e, n=n)
        return _PendingGroup(self.engine, prompt, context, candidates, self.settings.group_chunk)

    def _run_group(
        self, pending: _PendingGroup, errors: Errors, exact: bool, context_raises: bool = False
    ) -> list[ScoreResult | NvrmError]:
        if pending.error is not None:
            if errors == "raise" or context_raises:
                raise pending.error
            return [pending.error] * max(1, pending.n)
        out: list[Any] = [None] * pending.n
        prefix: Prefix | None = None
        for k, idx in enumerate(pending.slots):
            pending.submit_through(k)  # the next chunk prepares while this one is scored
            group: PreparedGroup = pending.futures[k].result()
            first = next((e for e in map(group.slot_error, range(len(idx))) if e is not None), None)
            if first is not None and (errors == "raise" or (context_raises and isinstance(group.context, NvrmError))):
                pending.cancel()
                raise group.context if isinstance(group.context, NvrmError) else first
            if isinstance(group.context, NvrmError):  # no chunk can score: every slot reports the context
                pending.cancel()
                return [group.context] * pending.n
            results, prefix = self._score_chunk(group, prefix, exact)
            if errors == "raise":
                first = next((r for r in results if isinstance(r, NvrmError)), None)
                if first is not None:
                    raise first
            for slot, r in zip(idx, results):
                out[slot] = r
        return out

    def score_prepared_group(self, group: PreparedGroup, *, exact: bool | None = None) -> list[ScoreResult | NvrmError]:
        """Results for a group the engine prepared: one per candidate slot, errors in their slots."""
        results, _ = self._score_chunk(group, None, self.settings.exact if exact is None else exact)
        return results

    def score_prepared_group_reusing(self, group: PreparedGroup, prefix: Prefix | None) -> tuple[list[ScoreResult | NvrmError], Prefix | None]:
        """Like :meth:`score_prepared_group` (not exact), reusing ``prefix`` when it is this group's prefill.

        Returns the results and the prefix that was used (``prefix`` itself, a new prefill, or None
        when no candidate could run), so a caller can keep it for later candidates of the same
        prompt and context."""
        return self._score_chunk(group, prefix, False)

    def _score_chunk(
        self, group: PreparedGroup, prefix: Prefix | None, exact: bool
    ) -> tuple[list[ScoreResult | NvrmError], Prefix | None]:
        """Score the good candidates of ``group`` (reusing ``prefix`` when it matches)."""
        out: list[Any] = [group.slot_error(j) for j in range(len(group.candidates))]
        rows = []
        for row, j in enumerate(group.good):
            try:
                self.limits.check_sequence_tokens(int(group.encoded.ids[row].shape[0]), f"candidate {j}")
                rows.append(row)
            except NvrmError as e:
                out[j] = e
        if not rows:
            return out, prefix
        enc = group.encoded if len(rows) == len(group.good) else group.encoded.select(rows)
        slots = [group.good[r] for r in rows]
        try:
            if exact:
                rewards: list[Any] = self._exact_group(group, slots)
            else:
                if prefix is None or not prefix.matches(enc):
                    prefix = Prefix.of(enc)
                norm = self.contract.normalize_hidden
                done = {r: prefill(self.backbone, self.head, prefix, enc, r, device=self.device, vision=self.vision, normalize_hidden=norm) for r in prefix.missing(enc)}
                rewards = score_suffixes(
                    self.backbone,
                    self.head,
                    prefix,
                    enc,
                    device=self.device,
                    max_batch_tokens=self.max_batch_tokens,
                    vision=self.vision,
                    normalize_hidden=norm,
                    done=done,
                )
        except NvrmError as e:
            rewards = [e] * len(slots)
        for row, (j, reward) in enumerate(zip(slots, rewards)):
            if isinstance(reward, NvrmError):
                out[j] = reward
            else:
                out[j] = self._result(group.context, group.candidates[j], int(enc.ids[row].shape[0]), reward)  # type: ignore[arg-type]
        return out, prefix

    def _exact_group(self, group: PreparedGroup, slots: Sequence[int]) -> list[float]:
        """Each candidate alone through the item path (no prefix reuse): bit-identical to ``score``."""
        ctx = group.context
        processor = self.engine.processor
        rope = RopeSpec.from_config(self.backbone.config)
        rewards = []
        for j in slots:
            cand = group.candidates[j]
            enc = encode_item(processor, rope, group.prompt, (ctx.pixels, ctx.grid), (cand.pixels, cand.grid), self.contract, self.engine.codec)
            rewards += self._forward([enc])
        return rewards

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
        """What is loaded and how it runs (path, revision, device, dtype, contract, engine)."""
        return {
            "path": str(self.path) if self.path else None,
            "revision": self.revision,
            "device": str(self.device),
            "dtype": str(self.backbone.dtype).replace("torch.", ""),
            "contract": self.contract.fingerprint,
            "preprocessing": self.fingerprint,
            "chat_template": getattr(self.processor, "_nvrm_template_source", "processor"),
            "max_batch_tokens": self.max_batch_tokens,
            "workers": {"count": self.engine.workers, "kind": self.engine.kind},
            "pixel_codec": self.engine.codec is not None,
            "packed_batches": self.packed,
        }


def off_contract_reasons(context: PreparedVideo, candidate: PreparedVideo, contract: Contract) -> tuple[str, ...]:
    """Which opt-ins an item actually used (a contract with an opt-in on scores ordinary items as usual)."""
    reasons = []
    if len(candidate.times) < contract.candidate_frames:
        reasons.append(f"short candidate: {len(candidate.times)} of {contract.candidate_frames} frames")
    return tuple(reasons)


def _default_attention(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def _manifest_revision(path: Path) -> str | None:
    from .bundle import read_integrity_manifest

    try:
        m = read_integrity_manifest(path)
    except NvrmError:
        return None
    return m.revision if m else None
