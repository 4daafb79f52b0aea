"""The preprocessing engine: the contract and encoding, in workers, with errors in their slots.

Every caller (``RewardModel``, the service, batch jobs, Ray, training, the
reports) prepares inputs through one ``Engine``; nothing else touches the
workers. The engine owns the contract, the workers and their processors.

    engine.prepare(value, role)                 -> PreparedVideo (encoded)
    engine.submit_item(prompt, ctx, cand)       -> Future[PreparedItem]
    engine.submit_group(prompt, ctx, cands)     -> Future[PreparedGroup]  (errors in slots)

A group's context and candidates are prepared in parallel; when all are done
the token ids and positions are built once per distinct candidate shape on a
small assembler thread, so the thread that drives the model only assembles
tensors and runs it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..contract import Contract
from ..errors import NvrmError
from ..video.inputs import PreparedVideo, presample
from ..limits import Limits
from .codec import PixelCodec
from .encode import GroupEncoded, RopeSpec, encode_item
from .tasks import PreparedItem, encode_video, group_job, item_job, refuse_long_rows, video_job
from .workers import WorkerKind, Workers, WorkerSpec, unexpected


@dataclass(frozen=True)
class PreparedGroup:
    """A group after the contract: each slot a prepared candidate or its error."""

    prompt: str
    context: PreparedVideo | NvrmError
    candidates: tuple[PreparedVideo | NvrmError, ...]
    encoded: GroupEncoded | None = field(default=None, repr=False)
    """Inputs of the good candidates (in slot order); None when none is good or the context failed."""
    error: NvrmError | None = None
    """Why ``encoded`` could not be built although the videos were fine (e.g. a bad prompt)."""

    @property
    def good(self) -> list[int]:
        """Slots whose candidate is prepared, in order (the rows of ``encoded``)."""
        if isinstance(self.context, NvrmError) or self.error is not None:
            return []
        return [i for i, c in enumerate(self.candidates) if isinstance(c, PreparedVideo)]

    def slot_error(self, i: int) -> NvrmError | None:
        """The error that slot ``i`` reports, if any (the context's or the prompt's first)."""
        if isinstance(self.context, NvrmError):
            return self.context
        if self.error is not None:
            return self.error
        c = self.candidates[i]
        return c if isinstance(c, NvrmError) else None


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


def _failed(e: BaseException) -> Future:
    f: Future = Future()
    f.set_exception(e)
    return f


class Engine:
    """Owns the contract, the workers and their processors."""

    def __init__(
        self,
        processor,
        contract: Contract,
        rope: RopeSpec,
        *,
        workers: int | None = None,
        kind: WorkerKind = "auto",
        limits: Limits | None = None,
    ):
        self.contract = contract
        self.rope = rope
        self.limits = limits or Limits()
        self.codec = PixelCodec.for_processor(processor, contract.min_pixels, contract.max_pixels)
        self._spec = WorkerSpec(processor, contract, self.codec, rope, self.limits)
        self._workers = Workers(self._spec, workers, kind)
        # group assembly (tokenising once per candidate shape) runs off the model's thread
        self._assembler = ThreadPoolExecutor(1, thread_name_prefix="nvrm-assemble")
        self._closed = False
        self._close_lock = threading.Lock()

    @classmethod
    def for_bundle(cls, path, *, workers: int | None = 0, kind: WorkerKind = "auto", limits: Limits | None = None) -> "Engine":
        """An engine for a bundle's processor, contract and config, without loading any weights.

        For processes that prepare inputs but never run the model (Ray's
        preprocessing tasks); ``workers=0`` runs every job on the calling thread.
        """
        from pathlib import Path

        from ..bundle import read_config
        from .selfcheck import load_checked_processor

        path = Path(path)
        return cls(
            load_checked_processor(path), Contract.for_bundle(path), RopeSpec.from_config(read_config(path)), workers=workers, kind=kind, limits=limits
        )

    @property
    def workers(self) -> int:
        return self._workers.workers

    @property
    def kind(self) -> str:
        """``"thread"``, ``"process"`` or ``"inline"`` (no workers)."""
        return self._workers.kind

    @property
    def processor(self):
        """The calling thread's own processor copy (for light work such as counting tokens)."""
        return self._workers.local_state().processor

    # ------------------------------------------------------------ videos

    def submit_video(self, value: Any, role: str) -> "Future[PreparedVideo]":
        """The contract for one context or candidate, run on a worker."""
        if isinstance(value, PreparedVideo) and value.encoded:
            try:
                return _done(self._workers.run_inline(video_job, value, role))  # checks role and contract only
            except NvrmError as e:
                return _failed(e)
        try:
            value = self._for_worker(value, role)
        except NvrmError as e:
            return _failed(e)
        return self._workers.submit(video_job, value, role)

    def prepare(self, value: Any, role: str) -> PreparedVideo:
        """The contract for one context or candidate (blocking)."""
        return self.submit_video(value, role).result()

    def encode(self, video: PreparedVideo) -> PreparedVideo:
        """Attach the vision input to a video prepared without it (on the calling thread)."""
        return self._workers.run_inline(encode_video, video)

    def _for_worker(self, value: Any, role: str) -> Any:
        # worker processes get only the sampled frames of an in-memory clip
        return presample(value, role, self.contract, self.limits) if self.kind == "process" else value

    # ------------------------------------------------------------ items

    def submit_item(self, prompt: str, context: Any, candidate: Any) -> "Future[PreparedItem]":
        """Both videos, the text and the positions of one item, on one worker."""
        try:
            context = self._for_worker(context, "context")
            candidate = self._for_worker(candidate, "candidate")
        except NvrmError as e:
            return _failed(e)
        return self._workers.submit(item_job, prompt, context, candidate)

    def prepare_item(self, prompt: str, context: Any, candidate: Any) -> PreparedItem:
        return self.submit_item(prompt, context, candidate).result()

    # ------------------------------------------------------------ groups

    def submit_group(
        self, prompt: str, context: "Any | Future[PreparedVideo]", candidates: Sequence[Any]
    ) -> "Future[PreparedGroup]":
        """Context and candidates in parallel, then the group's token ids and positions.

        ``context`` may be a future of an already submitted context (chunks of
        one big group share it). The returned future always resolves to a
        ``PreparedGroup``: bad inputs sit in their slots.
        """
        ctx_future = context if isinstance(context, Future) else self.submit_video(context, "context")
        cand_futures = [self.submit_video(c, "candidate") for c in candidates]
        out: Future = Future()
        pending = [len(cand_futures) + 1]
        lock = threading.Lock()
        # The callbacks stay on the futures (and on a context future shared by every chunk of a big
        # group): they reach the futures only through ``box``, emptied once the group is assembled, so
        # no reference cycle keeps a chunk's prepared frames alive until a full garbage collection.
        box = [ctx_future, cand_futures, out]

        def one_done(_: Future) -> None:
            with lock:
                pending[0] -= 1
                last = pending[0] == 0
                args = tuple(box) if last else ()
                if last:
                    box.clear()
            if last:
                try:
                    self._assembler.submit(self._assemble, prompt, *args)
                except RuntimeError as e:  # closed meanwhile
                    args[2].set_exception(e)

        for f in [ctx_future, *cand_futures]:
            f.add_done_callback(one_done)
        return out

    def prepare_group(self, prompt: str, context: Any, candidates: Sequence[Any]) -> PreparedGroup:
        return self.submit_group(prompt, context, candidates).result()

    def _assemble(self, prompt: str, ctx_future: Future, cand_futures: list[Future], out: Future) -> None:
        try:
            ctx = _outcome(ctx_future)
            cands = tuple(_outcome(f) for f in cand_futures)
            group = PreparedGroup(prompt, ctx, cands)
            good = group.good
            if good:
                try:
                    encoded = self._workers.run_inline(group_job, prompt, ctx, [cands[i] for i in good])
                    kept, refused = refuse_long_rows(self.limits, encoded, good)  # a candidate too long fails alone
                    group = PreparedGroup(prompt, ctx, tuple(refused.get(i, c) for i, c in enumerate(cands)), kept)
                except Exception as e:  # noqa: BLE001 - e.g. a bad prompt: every slot reports it
                    group = PreparedGroup(prompt, ctx, cands, None, unexpected(e))
            out.set_result(group)
        except BaseException as e:  # noqa: BLE001 - never leave the caller waiting
            out.set_exception(e)

    def encode_group(self, prompt: str, context: PreparedVideo, candidates: Sequence[PreparedVideo]) -> GroupEncoded:
        """Token ids and positions of a group whose videos are prepared (calling thread); a candidate over the
        sequence-token limit raises its ``LimitError``."""
        ctx = self.encode(context)
        encoded = self._workers.run_inline(group_job, prompt, ctx, [self.encode(c) for c in candidates])
        _, refused = refuse_long_rows(self.limits, encoded, range(len(candidates)))
        if refused:
            raise refused[min(refused)]
        return encoded

    # ------------------------------------------------------------ lifecycle

    def group_of(self, prompt: str, items: Sequence[PreparedItem]) -> PreparedGroup | None:
        """Prepared items that share ``prompt`` and one context (from separate requests), as one group;
        None if their sequences do not share the context prefix after all. No re-tokenising."""
        first = items[0]
        enc = GroupEncoded.from_items(
            self.rope,
            len(first.context.images),
            (first.context.pixels, first.context.grid),
            [it.encoded for it in items],
            [(it.candidate.pixels, it.candidate.grid) for it in items],
        )
        if enc is None:
            return None
        return PreparedGroup(prompt, first.context, tuple(it.candidate for it in items), enc)

    def items_of(self, group: PreparedGroup, slots: Sequence[int]) -> list:
        """Candidates ``slots`` of a prepared group, each encoded as a single item (for exact scoring);
        the frames are already prepared, so only the tokens and positions are built."""
        ctx = group.context
        return [
            encode_item(self.processor, self.rope, group.prompt, (ctx.pixels, ctx.grid), (c.pixels, c.grid), self.contract, self.codec)
            for c in (group.candidates[j] for j in slots)
        ]

    def close(self) -> None:
        """Stop the workers; pending jobs are cancelled."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._workers.close()
        self._assembler.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _outcome(f: Future) -> Any:
    """A finished job's result, or its error as a value."""
    if f.cancelled():
        from ..errors import InternalError

        return InternalError("internal error: preparation was cancelled")
    e = f.exception()
    return f.result() if e is None else unexpected(e)
