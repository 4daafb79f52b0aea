"""Python client for ``nvrm serve``: sync and async, binary frames, timeouts, retries with backoff.

    from .client import RewardClient
    client = RewardClient("http://127.0.0.1:8000")
    client.score("a prompt", "ctx.mp4", "cand.mp4").reward
    client.score_batch([("a prompt", "ctx.mp4", "cand.mp4")], errors="return")
    await client.ascore_group("a prompt", "ctx.mp4", ["a.mp4", "b.mp4"])

Torch-free: ``import nvrm.client`` loads httpx, NumPy, pydantic and tenacity,
never torch or transformers (a test checks ``sys.modules``).

Paths are sent as paths (the server must allow their folder). Bulk inputs
(``Clip`` frames, video bytes) travel as binary multipart parts by default
(``transport="binary"``; ``"json"`` sends them as base64 inside the JSON).

Two things keep uploads small (both on by default, both exact):

- **Sampling before upload** (``presample``): an in-memory ``Clip`` is cut to
  the frames the server's contract will use (its time plan, read once from
  ``/v1/info``: 5 of an 81-frame candidate), sent with their source times and
  the contract fingerprint; the server refuses a fingerprint it does not run.
  A torch tensor on the GPU copies only those frames to the host. Encoded
  files and bytes are still sent whole.
- **Contexts by content hash** (``context_refs``): a context (sampled frames or
  video bytes) is hashed (``protocol.context_ref``). If the server holds it
  (this client sent it before, or ``GET /v1/contexts/<hash>`` says so: another
  client did) the request names it ``{"ref": hash}`` and carries only the
  candidates; otherwise it goes inline once and the server keeps it. If the
  server lost it meanwhile (409 ``context_unknown``), the request is sent
  again with it inline.
Per-item errors come back as ``RemoteItemError`` (or are raised, with
``errors="raise"``), never as a made-up reward.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Sequence

import httpx
from pydantic import ValidationError

from .errors import RemoteItemError, ServiceError
from .protocol import ErrorCode, ItemError, ScoreResponse
from .remote.bodies import Encoding, KnownRefs, RequestBody, plan
from .remote.http import Transport
from .remote.job_handle import RemoteJob
from .results import ScoreResult, VllmScoreResult

__all__ = ["RewardClient", "RemoteItemError", "RemoteJob", "ServiceError"]

Errors = Literal["raise", "return"]


class RewardClient:
    """A client of one ``nvrm serve`` URL (or a Ray Serve route in front of several replicas).

    The face only: how a request body is built and its exchanges planned is ``nvrm.remote.bodies``,
    how they travel (retries, deadlines, size caps) ``nvrm.remote.http``.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 0.25,
        transport: Encoding = "binary",
        presample: bool = True,
        context_refs: bool = True,
        max_response_bytes: int = 16 << 20,
        http: httpx.Client | None = None,
        ahttp: httpx.AsyncClient | None = None,
        model: str | None = None,
        expect_revision: str | None = None,
    ):
        """
        Args:
            url: the service's base URL, e.g. ``http://127.0.0.1:8000``.
            api_key: bearer token when the server was started with ``--api-key-env``.
            timeout: seconds for one HTTP exchange as a whole (a slowly trickled answer is cut off too).
            retries: extra attempts on connection errors and 502/503/504 (honouring ``Retry-After``).
            backoff: first backoff in seconds; doubles per attempt, with jitter.
            transport: ``"binary"`` (multipart with raw ``.npy``/video parts) or ``"json"`` (base64).
            presample: send only the frames of an in-memory clip that the server's contract uses.
            context_refs: name contexts (sampled clips, video bytes) by content hash and upload each
                one once. Both need the server's contract, read once from ``/v1/info``; ``context_refs``
                works only with ``presample``.
            max_response_bytes: the largest answer read (a score answer is a few hundred bytes per item).
            http, ahttp: httpx clients to send with (for example an app served in process); by default
                the client opens its own pools.
            model: which of the server's models scores (``GET /v1/models``); None: its first.
            expect_revision: refuse (``ServiceError``, 409) unless that model is at this revision.
        """
        if transport not in ("binary", "json"):
            raise ValueError(f"transport must be 'binary' or 'json', got {transport!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.transport: Encoding = transport
        self.presample = presample
        self.context_refs = context_refs
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = Transport(self.url, headers=headers, timeout=timeout, retries=retries, backoff=backoff,
                              max_response_bytes=max_response_bytes, http=http, ahttp=ahttp)
        self._sampling: "tuple[Any, str] | None | bool" = False  # not read yet
        self._known = KnownRefs()  # context refs this client saw held by the server
        self._target = {k: v for k, v in (("model", model), ("expect_revision", expect_revision)) if v is not None}

    # ------------------------------------------------------------ bodies and results

    def sampling(self) -> "tuple[Any, str] | None":
        """(the server's contract, its fingerprint) for sampling before upload; None if off or unknown."""
        if self._sampling is False:
            self._sampling = None
            if self.presample or self.context_refs:
                from .contract import Contract

                try:
                    c = self.info()["contract"]
                    contract = Contract.from_dict(c["fields"])
                    # a server that publishes its time plan takes sampled frames and refs (0.3+); and the
                    # same contract code on both sides gives the same fingerprint
                    if "sampling" in c and contract.fingerprint == c["contract_fields_fingerprint"]:
                        self._sampling = (contract, contract.fingerprint)
                except ServiceError as e:
                    if e.status in (401, 403):  # a wrong key is the caller's to fix, not a server without a contract
                        self._sampling = False
                        raise
                    self._sampling = None
                except (KeyError, TypeError, ValueError):
                    self._sampling = None
                if self._sampling and (bad := self._sampling[0].beyond_sane_limits()):
                    self._sampling = False
                    raise ServiceError(f"the server at {self.url} publishes a contract beyond sane limits ({', '.join(bad)}); "
                                       "nothing is sampled by it: fix its bundle's nvrm_contract.json, or pass presample=False and context_refs=False")
        return self._sampling  # type: ignore[return-value]

    def _body(self, inline: bool = False) -> RequestBody:
        sampling = self.sampling() if self.presample else None
        return RequestBody(self.transport, sampling, self._known.held if self.context_refs else None, inline)

    def _items(self, items: Sequence[Any], exact: bool, inline: bool = False) -> tuple[RequestBody, dict[str, Any]]:
        body = self._body(inline)
        rows = []
        for i, it in enumerate(items):
            prompt, context, candidate = (it["prompt"], it["context"], it["candidate"]) if isinstance(it, dict) else it
            rows.append({"prompt": prompt, "context": body.video(context, f"item {i} context", "context"),
                         "candidate": body.video(candidate, f"item {i} candidate")})
        return body, {"items": rows, "exact": exact, **self._target}

    def _group(self, prompt: str, context: Any, candidates: Sequence[Any], exact: bool, inline: bool = False) -> tuple[RequestBody, dict[str, Any]]:
        body = self._body(inline)
        payload = {
            "prompt": prompt,
            "context": body.video(context, "context", "context"),
            "candidates": [body.video(c, f"candidate {i}") for i, c in enumerate(candidates)],
            "exact": exact,
            **self._target,
        }
        return body, payload

    def _post(self, path: str, build) -> Any:
        return self.http.run(plan(path, build, self._known))

    async def _apost(self, path: str, build) -> Any:
        return await self.http.arun(plan(path, build, self._known))

    @staticmethod
    def _results(payload: Any, errors: Errors, expected: int) -> list[ScoreResult | RemoteItemError]:
        try:
            response = ScoreResponse.model_validate(payload)
        except ValidationError as e:
            raise ServiceError(f"the service's answer is not a score response ({e.error_count()} problem(s))") from e
        if len(response.results) != expected:
            raise ServiceError(f"the service answered {len(response.results)} result(s) for {expected} item(s); no result is taken from it")
        out: list[ScoreResult | RemoteItemError] = []
        for i, r in enumerate(response.results):
            if isinstance(r, ItemError):
                err = RemoteItemError(i, ErrorCode.read(r.error.code), r.error.message)
                if errors == "raise":
                    raise err
                out.append(err)
            elif not math.isfinite(r.reward):  # never pass a non-finite number off as a reward
                err = RemoteItemError(i, ErrorCode.INTERNAL, f"the service returned a non-finite reward ({r.reward!r})")
                if errors == "raise":
                    raise err
                out.append(err)
            else:
                fields = (r.reward, tuple(r.context_times), tuple(r.candidate_times), r.num_tokens, response.contract,
                          response.model.revision, tuple(r.off_contract))
                doubt = r.uncertainty if r.uncertainty is not None and math.isfinite(r.uncertainty) else None
                out.append(VllmScoreResult(*fields, cached_tokens=r.cached_tokens or 0) if r.backend == "vllm"
                           else ScoreResult(*fields, uncertainty=doubt))
        return out

    # ------------------------------------------------------------ API

    def upload_context(self, context: Any) -> str:
        """Keep ``context`` (a ``Clip``, sampled by the server's contract, or video bytes) on the server and
        return its content hash; later requests from any client that hash it name it by ref. A trainer
        that holds a group's context can upload it once before its rollout workers score."""
        if self.sampling() is None:
            raise ServiceError("this server publishes no contract to sample by (or presample=False); send contexts inline")
        body = RequestBody(self.transport, self.sampling(), None, True)
        video = body.video(context, "context", "context")
        ref = self.http.request("POST", "/v1/contexts", **body.request({"context": video}))["ref"]
        self._known.remember(ref)
        return ref

    def score(self, prompt: str, context: Any, candidate: Any, *, exact: bool = False) -> ScoreResult:
        """Reward for one (prompt, context, candidate), like ``RewardModel.score``; raises on an error."""
        return self.score_batch([(prompt, context, candidate)], errors="raise", exact=exact)[0]  # type: ignore[return-value]

    def score_batch(self, items: Sequence[Any], *, errors: Errors = "raise", exact: bool = False) -> list[ScoreResult | RemoteItemError]:
        """Like ``RewardModel.score_batch``: (prompt, context, candidate) triples or dicts, one result per item, in order.

        Args:
            errors: ``"raise"`` raises the first item's ``RemoteItemError``; ``"return"`` puts it in its slot.
            exact: score every item alone on the server (bit-identical to ``score``).
        """
        return self._results(self._post("/v1/score", lambda inline: self._items(items, exact, inline)), errors, len(items))

    def score_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Errors = "raise", exact: bool = False):
        """Like ``RewardModel.score_group``: candidates sharing one prompt and context, one result each, in order."""
        return self._results(self._post("/v1/score_group", lambda inline: self._group(prompt, context, candidates, exact, inline)), errors, len(candidates))

    async def ascore(self, prompt: str, context: Any, candidate: Any, *, exact: bool = False) -> ScoreResult:
        """``score``, asynchronously."""
        return (await self.ascore_batch([(prompt, context, candidate)], errors="raise", exact=exact))[0]  # type: ignore[return-value]

    async def ascore_batch(self, items: Sequence[Any], *, errors: Errors = "raise", exact: bool = False):
        """``score_batch``, asynchronously."""
        return self._results(await self._apost("/v1/score", lambda inline: self._items(items, exact, inline)), errors, len(items))

    async def ascore_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Errors = "raise", exact: bool = False):
        """``score_group``, asynchronously."""
        return self._results(await self._apost("/v1/score_group", lambda inline: self._group(prompt, context, candidates, exact, inline)),
                             errors, len(candidates))

    def submit(self, items: Sequence[Any], *, errors: Errors = "return", exact: bool = False) -> RemoteJob:
        """``score_batch`` as a job: returns at once with a handle whose ``result()`` (or ``await aresult()``)
        gives the results later, so a trainer goes on while rollouts are scored."""
        answer = self._post("/v1/jobs/score", lambda inline: self._items(items, exact, inline))
        return RemoteJob.from_answer(self, answer, len(items), errors, self._results)

    def submit_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Errors = "return", exact: bool = False) -> RemoteJob:
        """``score_group`` as a job (see ``submit``)."""
        answer = self._post("/v1/jobs/score_group", lambda inline: self._group(prompt, context, candidates, exact, inline))
        return RemoteJob.from_answer(self, answer, len(candidates), errors, self._results)

    async def asubmit(self, items: Sequence[Any], *, errors: Errors = "return", exact: bool = False) -> RemoteJob:
        """``submit``, asynchronously."""
        answer = await self._apost("/v1/jobs/score", lambda inline: self._items(items, exact, inline))
        return RemoteJob.from_answer(self, answer, len(items), errors, self._results)

    def info(self) -> dict:
        """The service's ``/v1/info``: model, contract and limits."""
        return self.http.request("GET", "/v1/info")

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 now."""
        return self.http.status("/readyz") == 200

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until the model is loaded, or raise ``ServiceError`` after ``timeout`` seconds."""
        import time

        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise ServiceError(f"{self.url} was not ready after {timeout:g} s")
            time.sleep(0.2)

    def close(self) -> None:
        """Close the synchronous HTTP connection pool; the client can be used again afterwards (a new pool opens)."""
        self.http.close()

    async def aclose(self) -> None:
        """Close the asynchronous HTTP connection pool (await it from the event loop that used it)."""
        await self.http.aclose()

    def __enter__(self) -> "RewardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "RewardClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
