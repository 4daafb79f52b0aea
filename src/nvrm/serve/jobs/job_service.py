"""The service's asynchronous side: ``/v1/jobs`` and cosmos-rl's ``/api/reward/enqueue`` / ``pull``.

A job is admitted like a request (its body and an upper bound of its frames reserved in the byte
budget: decoded latents included) and then runs as a task while its submitter goes on; the
reservation is held until it finishes. Items of cosmos-rl's B = 1 requests that share a prompt
and a context (their conditioning frames, by content) reach the scheduler as items of one context,
so a prompt's n rollouts share one prefill, as ``/v1`` requests do.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from ...clip import Clip
from ...errors import RequestError
from ...protocol import ErrorCode, error_body
from ...results import item_dict, one_line
from ..admission.budget import frame_bytes
from ..protocols.cosmos.wire import Rollouts, frames_view, media_rules, parse_enqueue
from .local_store import JobStore
from ..admission.media import Media
from ..admission.requests import Work, parse_work
from ..serving import Body, Reply, Serving

ADMISSION_RETRY_S = 0.05
"""How often a job waiting for room in the scheduler's queue tries again (an accepted job is never dropped)."""


class JobService:
    """Submit-and-fetch over ``serving``'s admission and scheduler."""

    def __init__(self, serving: Serving):
        self.serving = serving
        c = serving.config
        self.store = JobStore(max_jobs=c.max_jobs, ttl_s=c.job_ttl_s, max_result_bytes=int(c.max_job_results_mb * 1024 * 1024))
        self.decoder = None
        self.decodes = None
        """The ``DecodeQueue`` over ``decoder``: rollouts of every request decoded in batches on their own thread, the
        first stage of a pipeline whose second is the scorer (nvrm.serve.protocols.cosmos.latents)."""
        self.shared = None
        """The Redis store every replica answers (``--job-store redis://``; nvrm.serve.jobs.shared_jobs), else None."""
        if c.job_store != "memory":
            from .shared_jobs import SharedJobs

            self.shared = SharedJobs(self)
            self.store = self.shared  # type: ignore[assignment] - its cancel_all stops the worker at shutdown

    def replica_answer(self) -> dict[str, str]:
        """``{"replica_id": ...}`` for an enqueue answer when this replica has a name (cosmos-rl pins its pulls to it)."""
        rid = self.serving.config.replica_id
        return {"replica_id": rid} if rid else {}

    def install_decoder(self, device) -> None:
        """Load ``--latent-decoder`` on the model's device (once the model is loaded)."""
        if self.serving.config.latent_decoder:
            from ..protocols.cosmos.latents import DecodeQueue, LatentDecoder

            path = self.serving.config.latent_decoder
            self.decoder = LatentDecoder(path, device)
            workers = None
            if self.decoder.device.type == "cpu" and self.serving.config.decode_workers != 0:
                import torch

                from ..protocols.cosmos.decode_workers import auto_workers, start_workers

                n = self.serving.config.decode_workers
                workers = start_workers(path, auto_workers(torch.get_num_threads()) if n < 0 else n, self.serving.config.decode_timeout_s)
                self.decoder.release()  # the workers hold the VAE; this process keeps what admission reads
            self.decodes = DecodeQueue(self.decoder, workers=workers)
        if self.shared is not None:
            self.shared.start_worker()

    # ------------------------------------------------------------ admission

    def _refuse_if_full(self) -> Reply | None:
        if (busy := self.serving.not_ready()) is not None:
            return busy
        why = self.store.admit()  # counted from now, before its body is read (given back by _holding_place)
        if why is not None:
            self.serving.metrics.rejected.labels(reason="jobs_full").inc()
            return Reply.error(ErrorCode.OVERLOADED, why, {"Retry-After": "1"})
        return None

    async def _holding_place(self, answer) -> Reply:
        """``await answer`` with the place ``_refuse_if_full`` admitted; given back unless a job started in it."""
        try:
            reply = await answer
        except BaseException:
            self.store.release()
            raise
        if reply.status != 200:
            self.store.release()
        return reply

    async def _start(self, kind: str, need: int, run, **extra) -> Reply:
        """Run ``run()`` as a job holding ``need`` bytes of the budget until it finishes."""
        budget = self.serving.budget
        if need > budget.max_bytes:
            return Reply.error(ErrorCode.TOO_LARGE, f"job: it needs up to {need} bytes, more than --max-inflight-mb allows "
                               f"({budget.max_bytes})")
        if not budget.try_reserve(need):
            return self.serving.overloaded("job")
        job = self.store.start(kind, run, on_done=lambda: budget.release(need), **extra)
        return Reply(200, {"uuid": job.id, **self.replica_answer()} if kind == "cosmos" else {"id": job.id, "status": "pending"})

    async def _admitted_results(self, work: Work, scheduler=None) -> Any:
        """The work's results (on ``scheduler``, default the model's), waiting (not failing) while its queue is full."""
        while True:
            results = await self.serving.results(work, scheduler)
            if not (isinstance(results, Reply) and results.body["error"]["code"] == ErrorCode.OVERLOADED):
                return results
            await asyncio.sleep(ADMISSION_RETRY_S)

    # ------------------------------------------------------------ nvrm's own jobs

    async def submit(self, kind: str, body: Body) -> Reply:
        """``POST /v1/jobs/score`` or ``/v1/jobs/score_group``: the request of ``/v1/score`` (``/v1/score_group``), run as a job."""
        if self.shared is not None:
            return await self.shared.submit(kind, body)
        if (full := self._refuse_if_full()) is not None:
            return full

        async def parsed(raw: bytes, reserved: int) -> Reply:
            work = await asyncio.to_thread(parse_work, self.serving, raw, body.content_type, kind)

            async def run() -> Reply:
                return await self.v1_results(work)

            return await self._start("v1", reserved + work.prepared_bytes, run)

        return await self._holding_place(self.serving.with_body(body, "job body", parsed))

    async def v1_results(self, work: Work) -> Reply:
        """A ``/v1/jobs`` job's answer: scored by the model it names (``model``, default the first) on the revision serving
        it when the job runs, each result tagged with both (as ``/v1/score``'s); 409 on an ``expect_revision`` mismatch."""
        registry = self.serving.registry
        try:
            entry = registry.acquire(work.model)
        except RequestError as e:
            return Reply.error(e.code, str(e), status=e.status)
        try:
            expected = work.expect_revision
            if expected is not None and expected != entry.revision:
                return Reply.error(ErrorCode.REVISION_MISMATCH,
                                   f"expect_revision is {expected}, but model {entry.name!r} is at revision {entry.revision}")
            results = await self._admitted_results(work, entry.scheduler)
            return results if isinstance(results, Reply) else self._answer(results, entry)
        finally:
            registry.release(entry)

    def _answer(self, results: list[Any], entry=None) -> Reply:
        m = self.serving.model if entry is None else entry.model
        tag = {} if entry is None else {"model": entry.name, "model_revision": entry.revision}
        model = {"revision": m.revision if entry is None else entry.revision, "path": str(m.path) if m.path else None,
                 **({"name": entry.name} if entry is not None else {})}
        body = {"results": [{**item_dict(r), **tag} for r in results], "model": model, "contract": m.fingerprint, "replica": self.serving.replica}
        return Reply(200, body)

    async def fetch(self, job_id: str) -> Reply:
        """``GET /v1/jobs/{id}``: 202 while it runs, then its answer (the body of ``/v1/score``), 404 once unknown."""
        if self.shared is not None:
            return await self.shared.fetch(job_id)
        job = self.store.get(job_id)
        if job is None or job.kind != "v1":
            return Reply.error(ErrorCode.JOB_UNKNOWN,
                               f"job {job_id[:32]} is not held by this server (unknown, or its result expired after --job-ttl-s)")
        if not job.done:
            return Reply(202, {"id": job.id, "status": "pending"}, {"Retry-After": "1"})
        if job.evicted:  # accepted, so never a 404: its result could not be kept
            return Reply.error(ErrorCode.TOO_LARGE, f"job {job.id}: {job.evicted}", status=507)
        job.fetched = True
        result = job.result
        if isinstance(result, Reply):
            body = result.body if result.status == 200 else {"error": result.body.get("error")}
            return Reply(200, {"id": job.id, "status": "done" if result.status == 200 else "failed", **body})
        return Reply(200, {"id": job.id, "status": "failed", **error_body(ErrorCode.INTERNAL, one_line(result))})

    # ------------------------------------------------------------ cosmos-rl

    async def enqueue(self, body: Body) -> Reply:
        """``POST /api/reward/enqueue``: a cosmos-rl rollout body, checked before any decoding, run as a job."""
        if self.shared is not None:
            return await self.shared.enqueue(body)
        if (full := self._refuse_if_full()) is not None:
            return full
        s = self.serving

        async def parsed(raw: bytes, reserved: int) -> Reply:
            req = await asyncio.to_thread(parse_enqueue, raw, s.model.limits, has_decoder=self.decoder is not None, rules=self.rules())
            need = reserved + req.decoded_bytes(self.decoder) + self._frames_bound(req)
            started = time.perf_counter()
            return await self._start("cosmos", need, lambda: self._score_rollouts(req, started), prompts=req.batch)

        return await self._holding_place(s.with_body(body, "enqueue body", parsed))

    def rules(self):
        """What images and latents become (issue 41), and the ``reward_fn`` names scored: the served models (issue 39)."""
        s = self.serving
        return media_rules(s.config, s.model.contract, self.decoder, getattr(s, "names", None) or ())

    def _frames_bound(self, req) -> int:
        """An upper bound of the prepared frames of ``req``'s rollouts: each its context frames and its candidate's."""
        model = self.serving.model
        contexts = min(self.serving.config.context_frames, model.limits.max_context_samples)
        per_model = req.batch * (contexts + model.contract.candidate_frames) * frame_bytes(model.contract, model.engine.codec is not None)
        return per_model * max(1, len(req.reward_fn))  # each named model prepares its own frames from the one decode

    async def _score_rollouts(self, req, started: float) -> Rollouts:
        s, c = self.serving, self.serving.config
        decode_s = None
        if req.media == "latent":
            # batched with other requests' rollouts on the decode thread, from whichever loop runs the job (the shared
            # queue's worker has its own); the frames are those of LatentDecoder.decode, bit for bit
            frames, decode_s = await asyncio.wrap_future(self.decodes.submit(req.array, req.sigma_data, req.refused, group=tuple(dict.fromkeys(req.prompts))))
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
        names = list(req.reward_fn) or list(s.names[:1])
        scored = [scored_by(self, name, items, dict(errors), req.batch, info) for name in names]
        outcomes = [await scored[0]] if len(scored) == 1 else await asyncio.gather(*scored)
        first, seconds = outcomes[0], time.perf_counter() - started
        return Rollouts(first.rewards, first.errors, first.info, seconds, decode_s, models=dict(zip(names, outcomes)))

    async def pull(self, job_id: str, kind: str) -> Reply:
        """``POST /api/reward/pull``: 425 while the job runs, its scores once done, 404 for an unknown or expired uuid."""
        if self.shared is not None:
            return await self.shared.pull(job_id, kind)
        job = self.store.get(job_id)
        if job is None or job.kind != "cosmos":
            return Reply.error(ErrorCode.JOB_UNKNOWN,
                               f"uuid {job_id[:40]} is not held by this server (unknown, or its result expired after --job-ttl-s)")
        if (unknown := self.unknown_type(kind)) is not None:
            return unknown
        if not job.done:
            return Reply.error(ErrorCode.NOT_READY, "the rewards are not ready yet; pull again", {"Retry-After": "1"}, status=425)
        if job.evicted:  # accepted, so never a 404: its result could not be kept
            return Reply.error(ErrorCode.TOO_LARGE, f"uuid {job.id}: {job.evicted}", status=507)
        job.fetched = True
        result = job.result
        if not isinstance(result, Rollouts):  # the job failed as a whole: every item says why, none is lost
            n = job.extra.get("prompts", 1)
            result = Rollouts([None] * n, {i: one_line(result) for i in range(n)})
        return self.pull_answer(result, kind)

    def unknown_type(self, kind: str) -> Reply | None:
        """A pull's ``type`` that no served model is named (400 naming the served ones), else None."""
        names = list(getattr(self.serving, "names", None) or ("nvrm",))
        if kind and kind not in names:
            return Reply.error(ErrorCode.BAD_REQUEST, f"type {kind[:40]!r} was not computed; this server computes {', '.join(names)} "
                               "(each reward_fn name is a served model)")
        return None

    def pull_answer(self, result: Rollouts, kind: str) -> Reply:
        """The pull answer of ``kind`` (empty: the first ``reward_fn`` name); 400 when the rollout did not name it."""
        computed = result.computed()
        if kind and computed and kind not in computed:
            return Reply.error(ErrorCode.BAD_REQUEST, f"type {kind[:40]!r} was not computed for this uuid; its reward_fn named "
                               f"{', '.join(computed)}")
        kind = kind or (computed[0] if computed else (getattr(self.serving, "names", None) or ["nvrm"])[0])
        return Reply(200, result.answer(kind, self.serving.config.cosmos_fallback_score))

    async def ping(self) -> Reply:
        """cosmos-rl's liveness probe, with the jobs held."""
        if self.shared is not None:
            return await self.shared.ping()
        return Reply(200, {"status": "ok", "ready": self.serving.model is not None, "jobs": len(self.store), "pending": self.store.pending})


# ------------------------------------------------------------ cosmos-rl: one decode, every named model


async def scored_by(jobs: "JobService", name: str, items: list, errors: dict[int, str], batch: int, info: dict) -> Rollouts:
    """``items`` scored by the served model ``name`` (counted in flight on the revision that takes them, so a
    swap meanwhile never frees it under them); its rewards, errors and ``input_info`` (with that revision)."""
    registry = jobs.serving.registry
    while True:
        try:
            entry = registry.acquire(name)
            break
        except RequestError as e:  # 503 while --swap-mode replace loads its new revision: an accepted job waits
            if e.status != 503:
                raise
            await asyncio.sleep(ADMISSION_RETRY_S)
    try:
        work = Work("score", False, items=[(p, ctx, cand) for _, p, ctx, cand in items])
        results = await jobs._admitted_results(work, entry.scheduler) if items else []
    finally:
        registry.release(entry)
    rewards: list[float | None] = [None] * batch
    off: list[list[str]] = [[] for _ in range(batch)]
    if isinstance(results, Reply):  # refused as a whole (shutting down): every item says why
        results = [RequestError("job", results.body["error"]["message"])] * len(items)
    for (i, *_), r in zip(items, results):
        if isinstance(r, BaseException):
            errors[i] = one_line(r)
        else:
            rewards[i] = r.reward
            off[i] = list(r.off_contract)
    own = {**info, "off_contract": off, "model": name, "model_revision": entry.revision, "contract": entry.fingerprint}
    return Rollouts(rewards, errors, own)

def context_media(frames, fps: float) -> Media:
    """The rollout's conditioning frames, keyed by content: a prompt's n rollouts share them, and one prefill."""
    if len(frames) == 0:
        return Media(None, "none")  # text-to-world: the no_context opt-in decides
    h = hashlib.sha256(f"cosmos|{frames.shape}|{fps!r}|".encode())
    h.update(frames.tobytes())
    return Media(Clip(frames, fps, name="conditioning frames"), "frames:" + h.hexdigest())
