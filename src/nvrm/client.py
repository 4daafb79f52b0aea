"""Python client for ``nvrm serve``: sync and async, binary frames, timeouts, retries with backoff.

    from nvrm.client import RewardClient
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

import json
import math
import os
import time
from collections import OrderedDict
from typing import Any, Literal, Sequence

import httpx
from pydantic import ValidationError
from tenacity import AsyncRetrying, Retrying, retry_if_exception_type, stop_after_attempt

from .clip import Clip
from .errors import InputError, RemoteItemError, ServiceError
from .protocol import REQUEST_PART, ROUTE_HEADER, ItemError, ScoreResponse, context_ref, encode_frames, npy_bytes
from .results import ScoreResult

__all__ = ["RewardClient", "RemoteItemError", "ServiceError"]

RETRY_STATUS = {502, 503, 504}
Transport = Literal["binary", "json"]
Errors = Literal["raise", "return"]


class _Retryable(Exception):
    """A failure worth another try (connection trouble, 502/503/504); carries the last error."""

    def __init__(self, error: ServiceError, retry_after: float | None):
        self.error = error
        self.retry_after = retry_after


class _Body:
    """A request being built: JSON, plus the binary parts its VIDEO objects name.

    A context (sampled clip or video bytes) goes by ``{"ref": hash}`` when ``holds(hash)`` says the
    server has it, else inline (the server then keeps it under that hash for later requests).
    ``inline=True`` sends every context inline (the retry after the server lost one)."""

    def __init__(self, transport: Transport, sampling: "tuple[Any, str] | None" = None, holds=None, inline: bool = False):
        self.transport = transport
        self.sampling = sampling
        self.holds = holds if sampling is not None else None
        self.inline = inline
        self.parts: list[tuple[str, bytes]] = []
        self.refs: list[str] = []
        """The content hashes of this body's contexts (sent by ref or inline)."""
        self.by_ref = False
        """Whether any context went by ref (a 409 can only come from those)."""

    def _context(self, ref: str, inline) -> dict[str, Any]:
        self.refs.append(ref)
        if not self.inline and self.holds(ref):  # type: ignore[misc]
            self.by_ref = True
            return {"ref": ref}
        return inline()

    def video(self, value: Any, where: str, role: str = "candidate") -> "dict[str, Any] | None":
        if value is None and role == "context":
            return None  # no context (the server's contract must have the no_context opt-in)
        if isinstance(value, (str, os.PathLike)):
            return {"path": os.path.abspath(os.fspath(value))}
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            if self.holds is not None and role == "context":
                ref = context_ref(self.sampling[1], data=data)  # type: ignore[index]
                return self._context(ref, lambda: self.encoded(data))
            return self.encoded(data)
        if isinstance(value, Clip):
            sampled = self._sample(value, role) if self.sampling is not None else None
            if sampled is not None:
                frames, times = sampled
                if self.holds is not None and role == "context":
                    ref = context_ref(self.sampling[1], frames=frames, times=times)  # type: ignore[index]
                    return self._context(ref, lambda: self.frames(frames, times=times))
                return self.frames(frames, times=times)
            if self.transport == "binary":
                return {"part": self._part(npy_bytes(value.numpy())), "fps": float(value.fps)}
            return {"frames": encode_frames(value.numpy()), "fps": float(value.fps)}
        if isinstance(value, dict) and value and set(value) <= {"path", "data", "frames", "fps"}:
            return value
        raise InputError(where, f"cannot send {type(value).__name__} to the service; pass a path, video bytes or nvrm.Clip")

    def encoded(self, data: bytes) -> dict[str, Any]:
        if self.transport == "binary":
            return {"part": self._part(data)}
        import base64

        return {"data": base64.b64encode(data).decode("ascii")}

    def frames(self, frames: Any, *, times: list[float]) -> dict[str, Any]:
        """Frames chosen by the contract's time plan, with their source times and the contract fingerprint."""
        extra = {"times": times, "sampled": self.sampling[1]}  # type: ignore[index]
        if self.transport == "binary":
            return {"part": self._part(npy_bytes(frames)), **extra}
        return {"frames": encode_frames(frames), **extra}

    def _sample(self, clip: Clip, role: str) -> "tuple[Any, list[float]] | None":
        """(the frames the server's contract would take, their times), or None to send the clip whole
        (an input the plan refuses: the server then reports the error in the item's slot)."""
        from .video.sampling import plan_candidate, plan_context

        contract = self.sampling[0]  # type: ignore[index]
        try:
            plan = (plan_candidate if role == "candidate" else plan_context)(clip.times, contract, clip.name, 1.0 / clip.fps)
        except InputError:
            return None
        return clip.take(plan.indices), [float(t) for t in plan.times]

    def _part(self, data: bytes) -> str:
        name = f"p{len(self.parts)}"
        self.parts.append((name, data))
        return name

    def request(self, payload: dict[str, Any], route: str | None = None) -> dict[str, Any]:
        """httpx keyword arguments for this body (routed by its first context ref, for Ray Serve)."""
        route = route or (self.refs[0] if self.refs else None)
        headers = {ROUTE_HEADER: route} if route else {}
        if not self.parts:
            return {"content": json.dumps(payload), "headers": {"content-type": "application/json", **headers}}
        files = [(REQUEST_PART, (None, json.dumps(payload), "application/json"))]
        files += [(name, (name, data, "application/octet-stream")) for name, data in self.parts]
        return {"files": files, "headers": headers}


_DONE = object()


def _advance(plan, reply: Any) -> tuple:
    """The plan's next exchange after ``reply`` (an answer, or a ``ServiceError`` to throw into it), or
    ``(_DONE, value)`` when it has finished."""
    try:
        return plan.throw(reply) if isinstance(reply, ServiceError) else plan.send(reply)
    except StopIteration as stop:
        return (_DONE, stop.value)


def _outcome(call) -> Any:
    """``call()``'s answer, or the ``ServiceError`` it raised (for the plan to handle)."""
    try:
        return call()
    except ServiceError as e:
        return e


def _whole(streamed: httpx.Response, body: bytearray) -> httpx.Response:
    """A streamed answer, read (and decoded) into ``body``, as an ordinary response."""
    headers = [(k, v) for k, v in streamed.headers.multi_items() if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(streamed.status_code, headers=headers, content=bytes(body), request=streamed.request)


class RewardClient:
    """A client of one ``nvrm serve`` URL (or a Ray Serve route in front of several replicas)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 0.25,
        transport: Transport = "binary",
        presample: bool = True,
        context_refs: bool = True,
        max_response_bytes: int = 16 << 20,
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
        """
        if transport not in ("binary", "json"):
            raise ValueError(f"transport must be 'binary' or 'json', got {transport!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.transport: Transport = transport
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.presample = presample
        self.context_refs = context_refs
        self.max_response_bytes = max_response_bytes
        self._sampling: "tuple[Any, str] | None | bool" = False  # not read yet
        self._known: "OrderedDict[str, None]" = OrderedDict()  # context refs this client saw held by the server
        self._sync: httpx.Client | None = None
        self._async: httpx.AsyncClient | None = None

    # ------------------------------------------------------------ one retry policy, sync and async

    def _wait(self, state) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Retryable) and error.retry_after is not None:
            return min(error.retry_after, 30.0)
        import random

        return self.backoff * (2 ** (state.attempt_number - 1)) * (0.5 + random.random())

    def _policy(self) -> dict[str, Any]:
        return {
            "stop": stop_after_attempt(self.retries + 1),
            "wait": self._wait,
            "retry": retry_if_exception_type(_Retryable),
            "reraise": True,
        }

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code in RETRY_STATUS:
            ra = response.headers.get("retry-after", "")
            raise _Retryable(self._failure(response), float(ra) if ra.replace(".", "", 1).isdigit() else None)
        if response.status_code >= 400 and response.status_code != 422:  # 422: every item failed on its input, same body
            raise self._failure(response)
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise ServiceError(f"service answered {response.status_code} with {kind}, not JSON: {response.text[:120]!r}", response.status_code) from None

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        try:
            for attempt in Retrying(**self._policy()):
                with attempt:
                    try:
                        deadline = time.monotonic() + self.timeout
                        with self._sync.stream(method, self.url + path, **kwargs) as r:
                            body = bytearray()
                            for chunk in r.iter_bytes():
                                body += self._bounded(chunk, body, deadline)
                            response = _whole(r, body)
                    except httpx.TransportError as e:
                        raise _Retryable(ServiceError(f"cannot reach {self.url}: {type(e).__name__}: {e}"), None) from e
                    return self._check(response)
        except _Retryable as e:
            raise e.error from None

    async def _arequest(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        try:
            async for attempt in AsyncRetrying(**self._policy()):
                with attempt:
                    try:
                        deadline = time.monotonic() + self.timeout
                        async with self._async.stream(method, self.url + path, **kwargs) as r:
                            body = bytearray()
                            async for chunk in r.aiter_bytes():
                                body += self._bounded(chunk, body, deadline)
                            response = _whole(r, body)
                    except httpx.TransportError as e:
                        raise _Retryable(ServiceError(f"cannot reach {self.url}: {type(e).__name__}: {e}"), None) from e
                    return self._check(response)
        except _Retryable as e:
            raise e.error from None

    def _bounded(self, chunk: bytes, body: bytearray, deadline: float) -> bytes:
        """``chunk``, unless the answer has passed the size cap or the exchange its deadline."""
        if len(body) + len(chunk) > self.max_response_bytes:
            raise ServiceError(f"{self.url}: the answer is larger than max_response_bytes={self.max_response_bytes}; not read further")
        if time.monotonic() > deadline:
            raise _Retryable(ServiceError(f"{self.url}: the answer took longer than timeout={self.timeout:g} s in all"), None)
        return chunk

    @staticmethod
    def _failure(response: httpx.Response) -> ServiceError:
        try:
            err = response.json()["error"]
            return ServiceError(f"service answered {response.status_code}: {err['message']}", response.status_code, err.get("code"))
        except Exception:  # noqa: BLE001 - not our JSON error body
            return ServiceError(f"service answered {response.status_code}: {response.text[:200]}", response.status_code)

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
                except (ServiceError, KeyError, TypeError, ValueError):
                    self._sampling = None
        return self._sampling  # type: ignore[return-value]

    def _body(self, inline: bool = False) -> _Body:
        sampling = self.sampling() if self.presample else None
        return _Body(self.transport, sampling, self._held if self.context_refs else None, inline)

    def _held(self, ref: str) -> bool:
        """Whether this client has seen the server hold context ``ref`` (no request; ``_plan`` asks)."""
        if ref in self._known:
            self._known.move_to_end(ref)
            return True
        return False

    def _items(self, items: Sequence[Any], exact: bool, inline: bool = False) -> tuple[_Body, dict[str, Any]]:
        body = self._body(inline)
        rows = []
        for i, it in enumerate(items):
            prompt, context, candidate = (it["prompt"], it["context"], it["candidate"]) if isinstance(it, dict) else it
            rows.append({"prompt": prompt, "context": body.video(context, f"item {i} context", "context"), "candidate": body.video(candidate, f"item {i} candidate")})
        return body, {"items": rows, "exact": exact}

    def _group(self, prompt: str, context: Any, candidates: Sequence[Any], exact: bool, inline: bool = False) -> tuple[_Body, dict[str, Any]]:
        body = self._body(inline)
        payload = {
            "prompt": prompt,
            "context": body.video(context, "context", "context"),
            "candidates": [body.video(c, f"candidate {i}") for i, c in enumerate(candidates)],
            "exact": exact,
        }
        return body, payload

    def _plan(self, path: str, build):
        """The exchanges of one scoring call, without I/O: yields ``(method, path, kwargs)``, is sent each
        answer (or thrown its ``ServiceError``), and returns the final answer. ``_post`` runs it with the
        sync client, ``_apost`` with the async one.

        Contexts this client has not seen held are asked about first (``GET /v1/contexts/<hash>``,
        routed like the requests that name them); held ones go by ref, the rest inline (the server
        keeps them). If the server lost one meanwhile (409 ``context_unknown``: evicted, or another
        replica), the request goes again with every context inline."""
        body, payload = build(False)
        unknown = [ref for ref in body.refs if ref not in self._known]
        for ref in unknown:
            try:
                yield "GET", f"/v1/contexts/{ref}", {"headers": {ROUTE_HEADER: ref}}
                self._remember(ref)
            except ServiceError as e:
                if e.code not in ("context_unknown", None) and (e.status or 0) not in (404, 405):
                    raise  # anything but "not held" (or a server without the store)
        if any(ref in self._known for ref in unknown):
            body, payload = build(False)  # some of them go by ref after all
        try:
            out = yield "POST", path, body.request(payload)
        except ServiceError as e:
            if e.code != "context_unknown" or not body.by_ref:
                raise
            for ref in body.refs:
                self._known.pop(ref, None)
            body, payload = build(True)
            out = yield "POST", path, body.request(payload)
        for ref in body.refs:
            self._remember(ref)
        return out

    def _post(self, path: str, build) -> Any:
        """Run ``_plan`` with the sync client."""
        plan, reply = self._plan(path, build), None
        while (step := _advance(plan, reply))[0] is not _DONE:
            reply = _outcome(lambda: self._request(step[0], step[1], **step[2]))
        return step[1]

    async def _apost(self, path: str, build) -> Any:
        """Run ``_plan`` with the async client."""
        plan, reply = self._plan(path, build), None
        while (step := _advance(plan, reply))[0] is not _DONE:
            try:
                reply = await self._arequest(step[0], step[1], **step[2])
            except ServiceError as e:
                reply = e
        return step[1]

    def _remember(self, ref: str) -> None:
        self._known[ref] = None
        self._known.move_to_end(ref)
        while len(self._known) > 4096:
            self._known.popitem(last=False)

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
                err = RemoteItemError(i, r.error.code, r.error.message)
                if errors == "raise":
                    raise err
                out.append(err)
            elif not math.isfinite(r.reward):  # never pass a non-finite number off as a reward
                err = RemoteItemError(i, "internal", f"the service returned a non-finite reward ({r.reward!r})")
                if errors == "raise":
                    raise err
                out.append(err)
            else:
                out.append(ScoreResult(r.reward, tuple(r.context_times), tuple(r.candidate_times), r.num_tokens, response.contract, response.model.revision, tuple(r.off_contract)))
        return out

    # ------------------------------------------------------------ API

    def upload_context(self, context: Any) -> str:
        """Keep ``context`` (a ``Clip``, sampled by the server's contract, or video bytes) on the server and
        return its content hash; later requests from any client that hash it name it by ref. A trainer
        that holds a group's context can upload it once before its rollout workers score."""
        if self.sampling() is None:
            raise ServiceError("this server publishes no contract to sample by (or presample=False); send contexts inline")
        body = _Body(self.transport, self.sampling(), None, True)
        video = body.video(context, "context", "context")
        ref = self._request("POST", "/v1/contexts", **body.request({"context": video}))["ref"]
        self._remember(ref)
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
        return self._results(await self._apost("/v1/score_group", lambda inline: self._group(prompt, context, candidates, exact, inline)), errors, len(candidates))

    def info(self) -> dict:
        """The service's ``/v1/info``: model, contract and limits."""
        return self._request("GET", "/v1/info")

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 now."""
        try:
            r = httpx.get(self.url + "/readyz", timeout=self.timeout)
        except httpx.TransportError:
            return False
        return r.status_code == 200

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
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close the asynchronous HTTP connection pool (await it from the event loop that used it)."""
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    def __enter__(self) -> "RewardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "RewardClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
