"""cosmos-rl's jobs: one enqueue body (B rollouts, as latents or frames) scored by every ``reward_fn`` name, pulled by
uuid and type. The kind the cosmos-rl protocol registers with the job service.

    parse  the enqueue body, checked before anything is decoded (``wire.parse_enqueue``)
    need   its decoding's peak (the latent decoder's, or the decoded frames) and an upper bound of its prepared frames
    run    decode on the decode thread (batched with other requests' rollouts), split each video into its context
           frames and its candidate, then every named model scores the same items on its own scheduler
    answer the pull answer of the type asked for (``wire.RolloutScores.answer``)

Items of B = 1 requests that share a prompt and a context (their conditioning frames, by content) reach the scheduler
as items of one context, so a prompt's n rollouts share one prefill, as ``/v1`` requests do.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from ....clip import Clip
from ....errors import RequestError
from ....protocol import ErrorCode
from ....results import one_line
from ...admission.budget import frame_bytes
from ...admission.media import Media
from ...admission.requests import ParseContext, Work
from ...http.messages import Reply
from ...jobs.kinds import JobKind
from ...jobs.storage import JobRecord
from ..spec import both_values, handed_out, Wire
from .wire import Enqueued, RolloutScores, frames_view


@dataclass(frozen=True)
class RolloutJob:
    """A parsed enqueue, and when it was parsed (its ``duration`` counts from there)."""

    req: Enqueued
    started: float


def context_media(frames, fps: float) -> Media:
    """The rollout's conditioning frames, keyed by content: a prompt's n rollouts share them, and one prefill."""
    if len(frames) == 0:
        return Media(None, "none")  # text-to-world: the no_context opt-in decides
    h = hashlib.sha256(f"cosmos|{frames.shape}|{fps!r}|".encode())
    h.update(frames.tobytes())
    return Media(Clip(frames, fps, name="conditioning frames"), "frames:" + h.hexdigest())


class RolloutJobs(JobKind):
    """The ``cosmos`` kind, over the cosmos-rl protocol (its decode, its encode, its latent decoder)."""

    name = "cosmos"
    noun = "uuid"
    body_name = "enqueue body"

    def __init__(self, protocol: Any):
        self.protocol, self.serving = protocol, protocol.serving
        self.peak_with_decoder = self.serving.config.job_store == "memory"
        """Whether ``need`` counts the latent decoder's peak (in process), or the decoded frames alone: a Redis job is
        counted so at submit and again by the replica that takes it."""

    # ------------------------------------------------------------ parse, need

    def parse(self, ctx: ParseContext, raw: bytes, content_type: str, variant: str) -> RolloutJob:
        return RolloutJob(self.protocol.decode(ctx, Wire(raw, content_type)), time.perf_counter())

    def need(self, job: RolloutJob) -> int:
        req = job.req
        return req.decoded_bytes(self.protocol.decoder if self.peak_with_decoder else None) + self.frames_bound(req)

    def frames_bound(self, req: Enqueued) -> int:
        """An upper bound of the prepared frames of ``req``'s rollouts: each its context frames and its candidate's."""
        model = self.serving.model
        contexts = min(self.serving.config.context_frames, model.limits.max_context_samples)
        per_model = req.batch * (contexts + model.contract.candidate_frames) * frame_bytes(model.contract, model.engine.codec is not None)
        return per_model * max(1, len(req.reward_fn))  # each named model prepares its own frames from the one decode

    def models(self, job: RolloutJob) -> list[str | None]:
        return list(job.req.reward_fn) or [None]

    def group(self, job: RolloutJob) -> str:
        return "c" + hashlib.sha256(json.dumps([job.req.prompts, job.req.fps]).encode()).hexdigest()[:24]

    def extra(self, job: RolloutJob) -> dict[str, Any]:
        return {"prompts": job.req.batch}

    def accepted(self, job_id: str) -> dict[str, Any]:
        """``{"uuid"}``, and ``replica_id`` when this replica has a name (cosmos-rl pins its pulls to it)."""
        rid = self.serving.config.replica_id
        return {"uuid": job_id, **({"replica_id": rid} if rid else {})}

    # ------------------------------------------------------------ run

    async def run(self, job: RolloutJob) -> dict[str, Any]:
        req, c = job.req, self.serving.config
        decode_s = None
        if req.media == "latent":
            # batched with other requests' rollouts on the decode thread, from whichever loop runs the job (the shared
            # queue's worker has its own); the frames are those of LatentDecoder.decode, bit for bit
            frames, decode_s = await asyncio.wrap_future(self.protocol.decodes.submit(req.array, req.sigma_data, req.refused,
                                                                                      group=tuple(dict.fromkeys(req.prompts))))
        else:
            frames = frames_view(req.array)
        items, errors = [], dict(req.refused)  # non-finite rollouts: never scored, named with the fallback
        for i, (prompt, fps) in enumerate(zip(req.prompts, req.fps)):
            if i in errors:
                continue
            video = frames[i]
            n = c.context_frames
            if n >= len(video):
                errors[i] = f"video {i}: {len(video)} frames, all of them context (--context-frames {n}); no candidate is left"
                continue
            items.append((i, prompt, context_media(video[:n], fps), Media(Clip(video[n:], fps, name=f"video {i}"), "")))
        info = {"shape": list(req.array.shape), "dtype": str(req.array.dtype), "media_type": req.media, "context_frames": c.context_frames,
                "video_fps": req.fps}
        # one decode, every reward_fn name: each served model scores the same items on its own scheduler (issue 39)
        names = list(req.reward_fn) or list(self.serving.names[:1])
        scored = [self.scored_by(name, items, dict(errors), req.batch, info) for name in names]
        outcomes = [await scored[0]] if len(scored) == 1 else await asyncio.gather(*scored)
        first, seconds = outcomes[0], time.perf_counter() - job.started
        return RolloutScores(first.rewards, first.errors, first.info, seconds, decode_s, models=dict(zip(names, outcomes))).to_json()

    async def scored_by(self, name: str, items: list, errors: dict[int, str], batch: int, info: dict) -> RolloutScores:
        """``items`` scored by the served model ``name`` (leased on the revision that takes them, waiting while it is
        replaced, so a swap meanwhile never frees it under them); its rewards, errors and ``input_info`` (with that revision)."""
        work = Work("score", False, items=[(p, ctx, cand) for _, p, ctx, cand in items], model=name)
        outcome = await self.serving.score(work, patient=True)
        if isinstance(outcome, Reply):  # refused as a whole (shutting down): every item says why
            results: list[Any] = [RequestError("job", outcome.message or f"status {outcome.status}")] * len(items)
            serving = self.serving.registry.entries.get(name)
            digest, fingerprint = (serving.digest, serving.fingerprint) if serving is not None else (None, None)
        else:
            results, digest, fingerprint = outcome.results, outcome.entry.digest, outcome.entry.fingerprint
        rewards: list[float | None] = [None] * batch
        off: list[list[str]] = [[] for _ in range(batch)]
        both: list[dict[str, float]] = [{} for _ in range(batch)]
        weight = self.serving.config.conservative
        for (i, *_), r in zip(items, results):
            if isinstance(r, BaseException):
                errors[i] = one_line(r)
            else:
                rewards[i] = handed_out(r, weight)
                off[i] = list(r.off_contract)
                both[i] = both_values(r)
        own = {**info, "off_contract": off, "model": name, "model_revision": digest, "contract": fingerprint}
        if any(both):  # the model has a guard: the raw rewards and uncertainties beside what was handed out
            own.update(raw_rewards=[b.get("raw_reward") for b in both], uncertainty=[b.get("uncertainty") for b in both], conservative=weight)
        return RolloutScores(rewards, errors, own)

    # ------------------------------------------------------------ answer

    def failed(self, extra: dict[str, Any], code: ErrorCode | str, message: str) -> dict[str, Any]:
        n = int(extra.get("prompts", 1))
        return RolloutScores([None] * n, {i: message for i in range(n)}).to_json()

    def pending(self, record: JobRecord) -> Reply:
        return Reply.error(ErrorCode.NOT_READY, "the rewards are not ready yet; pull again", {"Retry-After": "1"}, status=425)

    def refuse_query(self, query: str) -> Reply | None:
        """A pull's ``type`` that no served model is named (400 naming the served ones), else None."""
        names = list(self.serving.names or ("nvrm",))
        if query and query not in names:
            return Reply.error(ErrorCode.BAD_REQUEST, f"type {query[:40]!r} was not computed; this server computes {', '.join(names)} "
                               "(each reward_fn name is a served model)")
        return None

    def answer(self, record: JobRecord, query: str) -> Reply:
        """The pull answer of type ``query`` (the protocol's encode)."""
        return self.protocol.encode(query, RolloutScores.from_json(record.result or {}))

    def note_swap(self, outcome: dict[str, Any], asked: dict[str, str]) -> None:
        for name, scored in outcome.get("models", {}).items():  # scored by weights a swap put in the place of those asked for
            wanted = asked.get(name)
            if wanted is not None and scored["info"].get("model_revision") not in (None, wanted):
                scored["info"]["accepted_revision"] = wanted

