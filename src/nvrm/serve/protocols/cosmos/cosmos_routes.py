"""cosmos-rl's reward-service protocol: ``/api/reward/enqueue``, ``/pull`` and ``/ping``, over the job service.

    decode   an enqueue body -> ``Enqueued`` (``wire.parse_enqueue``: checked before anything is decoded)
    encode   a pull's type and the job's ``RolloutScores`` -> the pull answer (``RolloutScores.answer``)

An enqueue is a job of the ``cosmos`` kind this protocol registers (``rollout_kind.RolloutJobs``); its latents are
decoded by ``--latent-decoder`` (``latents.LatentDecoder``), loaded once the model is (``setup``), on the CPU in
worker processes (``decode_workers``).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from starlette.formparsers import MultiPartException
from starlette.requests import Request as StarletteRequest

from ....errors import RequestError
from ....protocol import ErrorCode, ErrorResponse
from ...admission.requests import ParseContext
from ...http.messages import Reply
from ...http.request_bodies import read_body
from ...http.routing import ERRORS, pending_body, respond
from ...jobs.job_service import JobService
from ...serving import Serving
from ..spec import ProtocolSpec, Wire
from .rollout_kind import RolloutJobs
from .wire import Enqueued, RolloutScores, media_rules, parse_enqueue

PULL_BODY_BYTES = 64 * 1024
"""The most a cosmos-rl pull body (a form with a uuid and a type) may hold, under ``--max-body-mb`` too."""


async def read_pull(request, max_bytes: int, timeout_s: float | None) -> tuple[str, str]:
    """The ``uuid`` and ``type`` of a ``POST /api/reward/pull`` form (urlencoded or multipart), its body read
    like every other one: refused (413) past ``min(max_bytes, PULL_BODY_BYTES)`` while it streams in, and
    (408) when it has not arrived within ``timeout_s``. Only then is the bounded body parsed as a form."""
    raw = bytes(await read_body(request, min(max_bytes, PULL_BODY_BYTES), timeout_s))

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    try:
        form = await StarletteRequest(request.scope, receive).form()
    except MultiPartException as e:
        raise RequestError("pull body", f"is not a valid form ({e.message})") from e
    return str(form.get("uuid", "")), str(form.get("type", "") or "")


class CosmosProtocol(ProtocolSpec[Enqueued]):
    """cosmos-rl's enqueue, pull and ping; holds the latent decoder (``decoder``) and its batching queue (``decodes``)."""

    name = "cosmos-rl"
    protected = ("/api/",)

    def __init__(self, serving: Serving, jobs: JobService):
        super().__init__(serving)
        self.jobs = jobs
        self.decoder = None
        self.decodes = None
        """The ``DecodeQueue`` over ``decoder``: rollouts of every request decoded in batches on their own thread, the
        first stage of a pipeline whose second is the scorer (``latents``)."""
        self.kind = RolloutJobs(self)
        jobs.register(self.kind)

    def setup(self, model) -> None:
        """Load ``--latent-decoder`` on the model's device (on the CPU, in worker processes unless ``--decode-workers 0``)."""
        config = self.serving.config
        if not config.latent_decoder:
            return
        from .latents import DecodeQueue, LatentDecoder

        self.decoder = LatentDecoder(config.latent_decoder, model.device)
        workers = None
        if self.decoder.device.type == "cpu" and config.decode_workers != 0:
            import torch

            from .decode_workers import auto_workers, start_workers

            n = config.decode_workers
            workers = start_workers(config.latent_decoder, auto_workers(torch.get_num_threads()) if n < 0 else n, config.decode_timeout_s)
            self.decoder.release()  # the workers hold the VAE; this process keeps what admission reads
        self.decodes = DecodeQueue(self.decoder, workers=workers)

    def close(self) -> None:
        """Stop the decode thread (the decode workers exit with it)."""
        if self.decodes is not None:
            self.decodes.close()

    def rules(self, ctx: ParseContext):
        """What images and latents become (issue 41), and the ``reward_fn`` names scored: the served models (issue 39)."""
        return media_rules(self.serving.config, ctx.default.model.contract, self.decoder, ctx.names)

    def decode(self, ctx: ParseContext, wire: Wire) -> Enqueued:
        """An enqueue body, refused (400, 413) naming what is wrong before anything is decoded."""
        return parse_enqueue(wire.raw, ctx.default.model.limits, has_decoder=self.decoder is not None, rules=self.rules(ctx))

    def encode(self, decoded: str, outcome: RolloutScores) -> Reply:
        """The pull answer of type ``decoded`` (empty: the first ``reward_fn`` name); 400 when the rollout did not name it."""
        computed = outcome.computed()
        if decoded and computed and decoded not in computed:
            return Reply.error(ErrorCode.BAD_REQUEST, f"type {decoded[:40]!r} was not computed for this uuid; its reward_fn named "
                               f"{', '.join(computed)}")
        kind = decoded or (computed[0] if computed else (self.serving.names or ["nvrm"])[0])
        return Reply(200, outcome.answer(kind, self.serving.config.cosmos_fallback_score))

    async def ping(self) -> Reply:
        """cosmos-rl's liveness probe, with the jobs held."""
        stats = await self.jobs.stats()
        if isinstance(stats, Reply):
            return stats
        return Reply(200, {"status": "ok", "ready": self.serving.model is not None, **stats})

    def attach_router(self, app: FastAPI) -> None:
        """Enqueue a rollout, pull its scores by uuid, ping."""
        router = APIRouter(prefix="/api/reward")
        config, jobs, kind = self.serving.config, self.jobs, self.kind.name

        @router.post("/enqueue", summary="cosmos-rl: a rollout (JSON, a newline, .npy latents or frames); answers {\"uuid\"}",
                     responses=ERRORS)
        async def cosmos_enqueue(request: Request):
            return respond(await jobs.submit(kind, pending_body(request, config)))

        @router.post("/pull", summary="cosmos-rl: the scores of a uuid (form uuid, type); 425 until ready",
                     responses={**ERRORS, 425: {"model": ErrorResponse}})
        async def cosmos_pull(request: Request):
            try:  # bounded in size and time like every other body (issue 43, item 10)
                uid, type_ = await read_pull(request, config.max_body_bytes, config.body_timeout_s)
            except RequestError as e:
                return respond(self.serving.refused(e))
            return respond(await jobs.fetch(kind, uid, type_))

        @router.get("/ping", summary="cosmos-rl: liveness of the reward service")
        async def cosmos_ping():
            return respond(await self.ping())

        @router.post("/ping", summary="cosmos-rl: liveness of the reward service (POST)")
        async def cosmos_ping_post():
            return respond(await self.ping())

        app.include_router(router)
