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
Per-item errors come back as ``RemoteItemError`` (or are raised, with
``errors="raise"``), never as a made-up reward.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal, Sequence

import httpx
from pydantic import ValidationError
from tenacity import AsyncRetrying, Retrying, retry_if_exception_type, stop_after_attempt

from .clip import Clip
from .errors import InputError, RemoteItemError, ServiceError
from .protocol import REQUEST_PART, ItemError, ScoreResponse, encode_frames, npy_bytes
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
    """A request being built: JSON, plus the binary parts its VIDEO objects name."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.parts: list[tuple[str, bytes]] = []

    def video(self, value: Any, where: str) -> dict[str, Any]:
        if isinstance(value, (str, os.PathLike)):
            return {"path": os.path.abspath(os.fspath(value))}
        if isinstance(value, (bytes, bytearray, memoryview)):
            if self.transport == "binary":
                return {"part": self._part(bytes(value))}
            import base64

            return {"data": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, Clip):
            if self.transport == "binary":
                return {"part": self._part(npy_bytes(value.numpy())), "fps": float(value.fps)}
            return {"frames": encode_frames(value.numpy()), "fps": float(value.fps)}
        if isinstance(value, dict) and value and set(value) <= {"path", "data", "frames", "fps"}:
            return value
        raise InputError(where, f"cannot send {type(value).__name__} to the service; pass a path, video bytes or nvrm.Clip")

    def _part(self, data: bytes) -> str:
        name = f"p{len(self.parts)}"
        self.parts.append((name, data))
        return name

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        """httpx keyword arguments for this body."""
        if not self.parts:
            return {"content": json.dumps(payload), "headers": {"content-type": "application/json"}}
        files = [(REQUEST_PART, (None, json.dumps(payload), "application/json"))]
        files += [(name, (name, data, "application/octet-stream")) for name, data in self.parts]
        return {"files": files}


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
    ):
        """
        Args:
            url: the service's base URL, e.g. ``http://127.0.0.1:8000``.
            api_key: bearer token when the server was started with ``--api-key-env``.
            timeout: seconds for one HTTP exchange.
            retries: extra attempts on connection errors and 502/503/504 (honouring ``Retry-After``).
            backoff: first backoff in seconds; doubles per attempt, with jitter.
            transport: ``"binary"`` (multipart with raw ``.npy``/video parts) or ``"json"`` (base64).
        """
        if transport not in ("binary", "json"):
            raise ValueError(f"transport must be 'binary' or 'json', got {transport!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.transport: Transport = transport
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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
        if response.status_code == 422:  # every item failed on its input: still per-item results
            return response.json()
        if response.status_code >= 400:
            raise self._failure(response)
        return response.json()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        try:
            for attempt in Retrying(**self._policy()):
                with attempt:
                    try:
                        response = self._sync.request(method, self.url + path, **kwargs)
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
                        response = await self._async.request(method, self.url + path, **kwargs)
                    except httpx.TransportError as e:
                        raise _Retryable(ServiceError(f"cannot reach {self.url}: {type(e).__name__}: {e}"), None) from e
                    return self._check(response)
        except _Retryable as e:
            raise e.error from None

    @staticmethod
    def _failure(response: httpx.Response) -> ServiceError:
        try:
            err = response.json()["error"]
            return ServiceError(f"service answered {response.status_code}: {err['message']}", response.status_code, err.get("code"))
        except Exception:  # noqa: BLE001 - not our JSON error body
            return ServiceError(f"service answered {response.status_code}: {response.text[:200]}", response.status_code)

    # ------------------------------------------------------------ bodies and results

    def _items(self, items: Sequence[Any], exact: bool) -> dict[str, Any]:
        body = _Body(self.transport)
        rows = []
        for i, it in enumerate(items):
            prompt, context, candidate = (it["prompt"], it["context"], it["candidate"]) if isinstance(it, dict) else it
            rows.append({"prompt": prompt, "context": body.video(context, f"item {i} context"), "candidate": body.video(candidate, f"item {i} candidate")})
        return body.request({"items": rows, "exact": exact})

    def _group(self, prompt: str, context: Any, candidates: Sequence[Any], exact: bool) -> dict[str, Any]:
        body = _Body(self.transport)
        payload = {
            "prompt": prompt,
            "context": body.video(context, "context"),
            "candidates": [body.video(c, f"candidate {i}") for i, c in enumerate(candidates)],
            "exact": exact,
        }
        return body.request(payload)

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
            else:
                out.append(ScoreResult(r.reward, tuple(r.context_times), tuple(r.candidate_times), r.num_tokens, response.contract, response.model.revision, tuple(r.off_contract)))
        return out

    # ------------------------------------------------------------ API

    def score(self, prompt: str, context: Any, candidate: Any, *, exact: bool = False) -> ScoreResult:
        """Reward for one (prompt, context, candidate), like ``RewardModel.score``; raises on an error."""
        return self.score_batch([(prompt, context, candidate)], errors="raise", exact=exact)[0]  # type: ignore[return-value]

    def score_batch(self, items: Sequence[Any], *, errors: Errors = "raise", exact: bool = False) -> list[ScoreResult | RemoteItemError]:
        """Like ``RewardModel.score_batch``: (prompt, context, candidate) triples or dicts, one result per item, in order.

        Args:
            errors: ``"raise"`` raises the first item's ``RemoteItemError``; ``"return"`` puts it in its slot.
            exact: score every item alone on the server (bit-identical to ``score``).
        """
        return self._results(self._request("POST", "/v1/score", **self._items(items, exact)), errors, len(items))

    def score_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Errors = "raise", exact: bool = False):
        """Like ``RewardModel.score_group``: candidates sharing one prompt and context, one result each, in order."""
        return self._results(self._request("POST", "/v1/score_group", **self._group(prompt, context, candidates, exact)), errors, len(candidates))

    async def ascore(self, prompt: str, context: Any, candidate: Any, *, exact: bool = False) -> ScoreResult:
        """``score``, asynchronously."""
        return (await self.ascore_batch([(prompt, context, candidate)], errors="raise", exact=exact))[0]  # type: ignore[return-value]

    async def ascore_batch(self, items: Sequence[Any], *, errors: Errors = "raise", exact: bool = False):
        """``score_batch``, asynchronously."""
        return self._results(await self._arequest("POST", "/v1/score", **self._items(items, exact)), errors, len(items))

    async def ascore_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Errors = "raise", exact: bool = False):
        """``score_group``, asynchronously."""
        return self._results(await self._arequest("POST", "/v1/score_group", **self._group(prompt, context, candidates, exact)), errors, len(candidates))

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
