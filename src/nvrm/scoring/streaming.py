"""Items and groups streamed through the engine and the model: preparation runs ahead of scoring.

- ``stream_batch``: items submitted to the engine a window ahead; each window scored in
  token-budgeted batches while the next is prepared;
- ``stream_groups``: groups prepared ``lookahead`` ahead; a big group in chunks of
  ``group_chunk`` candidates (``PendingGroup``), submitted as they are needed, its prefix reused
  across chunks.

A bad item or candidate fails its own slot (or raises, with ``errors="raise"``); nothing else.

Everything here works on a ``Pipeline``: the engine that prepares, the forward runtime that
scores and the ``ResultMaker`` that turns rewards into results. ``RewardModel`` builds one and
calls in; nothing here calls back into it (scoring -> streaming -> forward).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Sequence

from dataclasses import dataclass

from ..contract import Contract
from ..engine import Engine, PreparedGroup, PreparedItem
from ..engine.workers import unexpected
from ..errors import InternalError, ModelError, NvrmError
from ..forward.prefix import Prefix
from ..forward.readout import Tap
from ..forward.runtime import ForwardRuntime
from ..guard.trust import Guard
from ..guard.members import Member
from ..guard.monitor import Monitor
from ..guard.reading import read
from ..guard.stats import STATS
from ..results import ScoreResult
from ..settings import LoadSettings
from ..video.inputs import PreparedVideo
from ..video.sampling import candidate_ticks
from .items import Errors, GroupLike, ItemLike, as_group, as_item


@dataclass(frozen=True)
class ResultMaker:
    """Turns a reward into a ``ScoreResult``: the item's times, its tokens, the fingerprint and revision."""

    fingerprint: str
    revision: str | None
    contract: Contract

    def __call__(
        self, context: PreparedVideo, candidate: PreparedVideo, num_tokens: int, reward: float, uncertainty: float | None = None,
        stats: dict[str, float] | None = None,
    ) -> "ScoreResult | ModelError":
        """The result, or a ``ModelError`` in its place when the reward is not a finite number (never passed on)."""
        if not math.isfinite(reward):
            return ModelError(
                f"the model returned a non-finite reward ({reward!r}) for this item; its weights are broken "
                "(check the bundle with nvrm verify; an export of a run that diverged is not a model)"
            )
        return ScoreResult(
            reward=reward,
            context_times=context.times,
            candidate_times=candidate.times,
            num_tokens=num_tokens,
            contract=self.fingerprint,
            model_revision=self.revision,
            off_contract=off_contract_reasons(context, candidate, self.contract),
            uncertainty=uncertainty if uncertainty is None or math.isfinite(uncertainty) else None,
            frame_stats=stats,
        )


def off_contract_reasons(context: PreparedVideo, candidate: PreparedVideo, contract: Contract) -> tuple[str, ...]:
    """Which opt-ins an item actually used (a contract with an opt-in on scores ordinary items as usual)."""
    reasons = []
    if not context.times:
        reasons.append("no context")
    if len(candidate.times) < contract.candidate_frames:
        reasons.append(f"short candidate: {len(candidate.times)} of {contract.candidate_frames} frames")
    half = 0.5 / contract.sample_fps + 1e-6  # a frame chosen for tick k lies within half a tick of it
    off = [t for t, tick in zip(candidate.times, candidate_ticks(contract)) if abs(t - tick) > half]
    if off:  # frames pre-sampled at other times, or a source too sparse to hold a frame near each tick
        reasons.append(f"candidate frames off the {contract.sample_fps:g} FPS ticks (at {', '.join(f'{t:g}' for t in candidate.times)} s)")
    return tuple(reasons)


@dataclass(frozen=True)
class Pipeline:
    """The collaborators of every scoring path: prepare (engine), score (runtime), report (results)."""

    engine: Engine
    runtime: ForwardRuntime
    results: ResultMaker
    settings: LoadSettings
    guard: Guard | None = None
    """The bundle's guard: every result then carries an uncertainty, read from its own forward (``nvrm.guard``)."""
    monitor: Monitor | None = None
    """Rolling statistics of every item scored (``RewardModel.watch``; the service's per-model monitor)."""
    members: tuple[Member, ...] = ()
    """The guard's opt-in check (``nvrm.guard.members``): models that truly differ, run on every item (``members=True`` at
    load), or on a sampled share of the calls for the monitor alone (``member_rate``)."""

    def observe(self, results: Sequence[Any]) -> list[Any]:
        """``results``, after the monitor (if any) has seen them."""
        if self.monitor is not None:
            for r in results:
                self.monitor.add_result(r)
        return list(results)

    @property
    def limits(self):
        return self.settings.limits

    def score_prepared(self, prepared: Sequence[PreparedItem], *, exact: bool | None = None) -> list["ScoreResult | ModelError"]:
        """Prepared items in token-budgeted batches (or one by one with ``exact``); input order. A
        non-finite reward is a ``ModelError`` in its slot."""
        exact = self.settings.exact if exact is None else exact
        tap = self.runtime.tap() if self.guard is not None else None
        rewards = self.runtime.batched([p.encoded for p in prepared], exact=exact, **({"tap": tap} if tap is not None else {}))
        doubts, stats = self.uncertainties(tap, rewards, [(p.candidate, p.context) for p in prepared],
                                           lambda m: m.runtime.batched([p.encoded for p in prepared], exact=False))
        return self.observe([self.results(p.context, p.candidate, p.encoded.num_tokens, r, u, st)
                             for p, r, u, st in zip(prepared, rewards, doubts, stats)])

    def uncertainties(self, tap: Tap | None, rewards: Sequence[Any], videos: Sequence[tuple[Any, Any]],
                      members: Callable[[Member], Sequence[float]] | None = None) -> tuple[list[Any], list[Any]]:
        """The guard's uncertainty and the frame statistics of each row a ``tap`` saw (``videos[i]``: row i's (candidate, context),
        each with ``pixels`` and ``grid``); Nones without a guard, or for a row whose reward is not a number. With members
        loaded, ``members(member)`` runs one member on the same rows (its raw rewards, in row order): with ``members=True``
        each uncertainty is the larger of the guard's and the members' (``nvrm.guard.members``); with a ``member_rate``,
        on the calls the monitor draws, only the monitor learns theirs and the results keep the guard's."""
        out: list[float | None] = [None] * len(videos)
        stats: list[dict[str, float] | None] = [None] * len(videos)
        if tap is None or self.guard is None or not videos:
            return out, stats
        rows = [i for i, r in enumerate(rewards) if isinstance(r, float) and math.isfinite(r) and i in tap.last and i in tap.frames]
        if rows:
            import torch

            reading = read(
                [tap.frames[i] for i in rows], [tap.last[i] for i in rows], torch.tensor([rewards[i] for i in rows]),
                [(videos[i][0].pixels, videos[i][0].grid) for i in rows], [(videos[i][1].pixels, videos[i][1].grid) for i in rows],
                self.engine.codec.patch_size if self.engine.codec is not None else 16,
            )
            doubt = self.guard.uncertainty(reading)
            if self.members and members is not None:
                if self.settings.members:
                    doubt = self.member_doubt(doubt, reading.reward, rows, members)
                    if self.monitor is not None:
                        self.monitor.add_members(doubt.cpu().tolist())
                elif self.monitor is not None and self.monitor.draw(self.settings.member_rate):
                    try:  # the monitor's alone: a member that fails here costs its reading, never a result
                        self.monitor.add_members(self.member_doubt(doubt, reading.reward, rows, members).cpu().tolist())
                    except Exception as e:  # noqa: BLE001
                        logging.getLogger("nvrm").warning("the sampled members' check of %d item(s) failed; the results keep the "
                                                          "guard's uncertainty: %s", len(rows), e)
            for i, u, st in zip(rows, doubt.cpu().tolist(), reading.stats.cpu().tolist()):
                out[i] = float(u)
                stats[i] = dict(zip(STATS, st))
        return out, stats

    def member_doubt(self, doubt: Any, reward: Any, rows: Sequence[int], members: Callable[[Member], Sequence[float]]) -> Any:
        """``doubt`` [R] raised to what the members put in doubt of ``reward`` [R] (rows ``rows`` of what ``members`` scores)."""
        import torch

        from ..guard.members import doubt as combine

        calibrated = []
        for m in self.members:
            got = [float(v) for v in members(m)]
            mine = [got[i] for i in rows]
            if not all(math.isfinite(v) for v in mine):
                raise ModelError(f"member {m.name} returned a non-finite reward; its weights are broken (check the bundle with nvrm verify)")
            calibrated.append([m.bar(v) for v in mine])
        table = torch.tensor(calibrated, dtype=doubt.dtype, device=doubt.device)
        return combine(doubt, reward.to(doubt.device, doubt.dtype), table)


class PendingGroup:
    """A group handed to the engine: its context future, and its candidates in chunks that are
    submitted as they are needed (at most ``CHUNKS_AHEAD`` beyond the one being scored), so a
    group of thousands never has more than a few chunks prepared in memory at once."""

    CHUNKS_AHEAD = 1

    def __init__(
        self, engine=None, prompt: Any = None, context: Any = None, candidates: Sequence[Any] = (), chunk: int = 1, error: NvrmError | None = None, n: int = 0
    ):
        self.engine = engine
        self.prompt = prompt
        self.candidates = list(candidates)
        self.n = len(self.candidates) if error is None else n
        self.error = error
        self.slots = [list(range(s, min(s + chunk, self.n))) for s in range(0, self.n, chunk)] if error is None else []
        self.futures: list[Future | None] = []
        """One per submitted chunk; None once scored (its prepared frames are let go at once)."""
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
            if f is not None:
                f.cancel()


def stream_batch(pipe: Pipeline, items: Iterable[ItemLike], *, errors: Errors, exact: bool | None) -> list[Any]:
    """``RewardModel.score_batch``: one result (or error) per item, in order."""
    items = list(items)
    out: list[Any] = [None] * len(items)
    window = max(8, 4 * max(1, pipe.engine.workers))
    pending: deque[tuple[int, Future | NvrmError]] = deque()
    i_next = 0

    def submit_until(limit: int) -> None:
        nonlocal i_next
        while i_next < len(items) and len(pending) < limit:
            try:
                it = as_item(items[i_next], i_next)
                pending.append((i_next, pipe.engine.submit_item(it.prompt, it.context, it.candidate)))
            except NvrmError as e:
                pending.append((i_next, e))
            i_next += 1

    submit_until(2 * window)  # the engine prepares the next windows while this one is on the model
    while pending:
        good = []
        while pending and len(good) < window:
            slot, job = pending.popleft()
            try:
                prepared = job.result() if isinstance(job, Future) else job
                if isinstance(prepared, NvrmError):
                    raise prepared
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
            prepared = [p for _, p in good]
            results = pipe.score_prepared(prepared, exact=exact) if errors == "raise" else score_prepared_each(pipe, prepared, exact=exact)
            if errors == "raise":
                first = next((r for r in results if isinstance(r, NvrmError)), None)
                if first is not None:
                    raise first
            for (slot, _), result in zip(good, results):
                out[slot] = result
    return out


def score_prepared_each(pipe: Pipeline, prepared: Sequence[Any], *, exact: bool | None) -> list[Any]:
    """``score_prepared``, where an unexpected failure of the whole batch is retried item by item, so one
    item cannot sink the rest: one result or error per item, in order. The one fallback the service,
    batch jobs and ``score_batch(errors="return")`` share."""
    try:
        return pipe.score_prepared(prepared, exact=exact)
    except Exception:  # noqa: BLE001 - retried below; what still fails is reported in its slot
        logging.getLogger("nvrm").warning("a batch of %d failed; retrying item by item", len(prepared), exc_info=True)
    out: list[Any] = []
    for p in prepared:
        try:
            out.append(pipe.score_prepared([p], exact=True)[0])
        except NvrmError as e:
            out.append(e)
        except Exception as e:  # noqa: BLE001
            out.append(InternalError.wrap(e))
    return out


def stream_groups(pipe: Pipeline, groups: Iterable[GroupLike], *, errors: Errors, exact: bool | None, lookahead: int | None, context_raises: bool = False):
    """``RewardModel.score_groups``: one list of results per group, in order, preparing ahead."""
    ahead = pipe.settings.lookahead if lookahead is None else lookahead
    exact = pipe.settings.exact if exact is None else exact
    it = iter(enumerate(groups))
    pending: deque[PendingGroup] = deque()

    def fill(limit: int) -> None:
        while len(pending) < limit:
            try:
                k, group = next(it)
            except StopIteration:
                return
            pending.append(submit_group(pipe, group, k))

    fill(ahead + 1)
    try:
        while pending:
            current = pending.popleft()
            fill(ahead)  # groups k+1 .. k+ahead prepare while group k is on the model
            yield run_group(pipe, current, errors, exact, context_raises)
    finally:
        for p in pending:
            p.cancel()


def submit_group(pipe: Pipeline, group: GroupLike, k: int) -> PendingGroup:
    try:
        prompt, context, candidates = as_group(group, k)
        pipe.limits.check_group(len(candidates))
    except NvrmError as e:
        n = len(group[2]) if isinstance(group, (tuple, list)) and len(group) == 3 and isinstance(group[2], Sequence) else 0
        return PendingGroup(error=e, n=n)
    return PendingGroup(pipe.engine, prompt, context, candidates, pipe.settings.group_chunk)


def run_group(pipe: Pipeline, pending: PendingGroup, errors: Errors, exact: bool, context_raises: bool = False) -> list[Any]:
    if pending.error is not None:
        if errors == "raise" or context_raises:
            raise pending.error
        return [pending.error] * max(1, pending.n)
    out: list[Any] = [None] * pending.n
    prefix = None
    for k, idx in enumerate(pending.slots):
        pending.submit_through(k)  # the next chunk prepares while this one is scored
        try:
            group = pending.futures[k].result()  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001 - this chunk could not be prepared: only its slots say so
            if errors == "raise":
                pending.cancel()
                raise
            pending.futures[k] = None
            for slot in idx:
                out[slot] = unexpected(e)
            continue
        first = next((e for e in map(group.slot_error, range(len(idx))) if e is not None), None)
        if first is not None and (errors == "raise" or (context_raises and isinstance(group.context, NvrmError))):
            pending.cancel()
            raise group.context if isinstance(group.context, NvrmError) else first
        if isinstance(group.context, NvrmError):  # no chunk can score: every slot reports the context
            pending.cancel()
            return [group.context] * pending.n
        pending.futures[k] = None  # memory stays flat in the group size: nothing of a scored chunk is kept
        try:
            results, prefix = score_chunk(pipe, group, prefix, exact)
        except Exception as e:  # noqa: BLE001 - e.g. an allocation failure: this chunk's candidates fail, the rest go on
            if errors == "raise":
                raise
            logging.getLogger("nvrm").warning("a chunk of %d candidates failed unexpectedly", len(idx), exc_info=True)
            results, prefix = [group.slot_error(j) or InternalError.wrap(e) for j in range(len(idx))], None  # bad inputs keep their own
        del group
        if errors == "raise":
            first = next((r for r in results if isinstance(r, NvrmError)), None)
            if first is not None:
                raise first
        for slot, r in zip(idx, results):
            out[slot] = r
    return out


def score_chunk(pipe: Pipeline, group: PreparedGroup, prefix: Prefix | None, exact: bool) -> tuple[list[Any], Prefix | None]:
    """The good candidates of a prepared group scored (reusing ``prefix`` when it matches), the others'
    errors in their slots: (results in candidate order, the prefix used)."""
    out: list[Any] = [group.slot_error(j) for j in range(len(group.candidates))]  # a sequence too long is one (engine)
    slots = group.good
    if not slots:
        return out, prefix
    enc = group.encoded
    tap = pipe.runtime.tap() if pipe.guard is not None else None
    try:
        guarded = {"tap": tap} if tap is not None else {}
        if exact:  # each candidate alone, as the engine encodes a single item: bit-identical to score
            rewards: list[Any] = pipe.runtime.batched(pipe.engine.items_of(group, slots), exact=True, **guarded)
        else:
            rewards, prefix = pipe.runtime.group(enc, prefix, **guarded)
    except NvrmError as e:
        rewards = [e] * len(slots)
    doubts, stats = pipe.uncertainties(tap, rewards, [(group.candidates[j], group.context) for j in slots],
                                       lambda m: m.runtime.group(enc, None)[0])
    for row, (j, reward) in enumerate(zip(slots, rewards)):
        if isinstance(reward, NvrmError):
            out[j] = reward
        else:
            out[j] = pipe.results(group.context, group.candidates[j], int(enc.ids[row].shape[0]), reward, doubts[row], stats[row])
    pipe.observe([out[j] for j in slots])
    return out, prefix
