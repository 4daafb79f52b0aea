"""Python client for ``nvrm serve``: sync and async, timeouts, retries with backoff.

    from nvrm.client import RewardClient
    client = RewardClient("http://127.0.0.1:8000")
    client.score([("a prompt", "ctx.mp4", "cand.mp4")])[0].reward
    await client.ascore_group("a prompt", "ctx.mp4", ["a.mp4", "b.mp4"])

Paths are sent as paths (the server must allow their folder); bytes as
base64 video; ``Clip`` objects as base64 ``.npy`` frames with their fps.
Per-item errors come back as ``RemoteItemError`` (or are raised, with
``errors="raise"``), never as a made-up reward.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import time
from typing import Any, Literal, Sequence

import httpx
import numpy as np

from .errors import InputError, NvrmError
from .inputs import Clip
from .scoring import ScoreResult


class ServiceError(NvrmError):
    """The service refused or failed a whole request (after retries)."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class RemoteItemError(NvrmError):
    """One item the service could not score; ``code`` is the service's error code."""

    def __init__(self, index: int, code: str, message: str):
        super().__init__(f"item {index}: {message}")
        self.index = index
        self.code = code


RETRY_STATUS = {502, 503, 504}


def video_payload(value: Any, where: str = "video") -> dict:
    """A context or candidate as the service's VIDEO object."""
    if isinstance(value, (str, os.PathLike)):
        return {"path": os.path.abspath(os.fspath(value))}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"data": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Clip):
        from .serve.media import encode_frames

        return {"frames": encode_frames(np.asarray(value.frames)), "fps": float(value.fps)}
    if isinstance(value, dict) and len(value) >= 1 and set(value) <= {"path", "data", "frames", "fps"}:
        return value
    raise InputError(where, f"cannot send {type(value).__name__} to the service; pass a path, video bytes or nvrm.Clip")


class RewardClient:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 0.25,
    ):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._sync: httpx.Client | None = None
        self._async: httpx.AsyncClient | None = None

    # ------------------------------------------------------------ plumbing

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            ra = response.headers.get("retry-after")
            if ra and ra.replace(".", "", 1).isdigit():
                return min(float(ra), 30.0)
        return self.backoff * (2**attempt) * (0.5 + random.random())

    @staticmethod
    def _failure(response: httpx.Response) -> ServiceError:
        try:
            err = response.json()["error"]
            return ServiceError(f"service answered {response.status_code}: {err['message']}", response.status_code, err.get("code"))
        except Exception:  # noqa: BLE001
            return ServiceError(f"service answered {response.status_code}: {response.text[:200]}", response.status_code)

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, headers=self.headers)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = self._sync.request(method, self.url + path, json=body)
            except httpx.TransportError as e:
                last = ServiceError(f"cannot reach {self.url}: {type(e).__name__}: {e}")
            else:
                if response.status_code not in RETRY_STATUS:
                    return self._decode(response)
                last = self._failure(response)
            if attempt < self.retries:
                time.sleep(self._delay(attempt, response))
        raise last  # type: ignore[misc]

    async def _arequest(self, method: str, path: str, body: Any = None) -> Any:
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = await self._async.request(method, self.url + path, json=body)
            except httpx.TransportError as e:
                last = ServiceError(f"cannot reach {self.url}: {type(e).__name__}: {e}")
            else:
                if response.status_code not in RETRY_STATUS:
                    return self._decode(response)
                last = self._failure(response)
            if attempt < self.retries:
                await asyncio.sleep(self._delay(attempt, response))
        raise last  # type: ignore[misc]

    def _decode(self, response: httpx.Response) -> Any:
        if response.status_code == 422:  # every item failed on its input: still per-item results
            return response.json()
        if response.status_code >= 400:
            raise self._failure(response)
        return response.json()

    @staticmethod
    def _results(payload: dict, errors: str) -> list[ScoreResult | RemoteItemError]:
        out: list[Any] = []
        for i, r in enumerate(payload["results"]):
            if "error" in r:
                e = RemoteItemError(i, r["error"]["code"], r["error"]["message"])
                if errors == "raise":
                    raise e
                out.append(e)
            else:
                out.append(
                    ScoreResult(
                        reward=float(r["reward"]),
                        context_times=tuple(r["context_times"]),
                        candidate_times=tuple(r["candidate_times"]),
                        num_tokens=int(r["num_tokens"]),
                        contract=payload["contract"],
                        model_revision=payload["model"].get("revision"),
                    )
                )
        return out

    @staticmethod
    def _items_body(items: Sequence[Any]) -> dict:
        body = []
        for i, it in enumerate(items):
            prompt, context, candidate = (it["prompt"], it["context"], it["candidate"]) if isinstance(it, dict) else it
            body.append(
                {
                    "prompt": prompt,
                    "context": video_payload(context, f"item {i} context"),
                    "candidate": video_payload(candidate, f"item {i} candidate"),
                }
            )
        return {"items": body}

    @staticmethod
    def _group_body(prompt: str, context: Any, candidates: Sequence[Any]) -> dict:
        return {
            "prompt": prompt,
            "context": video_payload(context, "context"),
            "candidates": [video_payload(c, f"candidate {i}") for i, c in enumerate(candidates)],
        }

    # ------------------------------------------------------------ API

    def score(self, items: Sequence[Any], *, errors: Literal["raise", "return"] = "return") -> list[ScoreResult | RemoteItemError]:
        """``items``: (prompt, context, candidate) triples or dicts; results in order."""
        return self._results(self._request("POST", "/v1/score", self._items_body(items)), errors)

    def score_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Literal["raise", "return"] = "return"):
        return self._results(self._request("POST", "/v1/score_group", self._group_body(prompt, context, candidates)), errors)

    async def ascore(self, items: Sequence[Any], *, errors: Literal["raise", "return"] = "return"):
        return self._results(await self._arequest("POST", "/v1/score", self._items_body(items)), errors)

    async def ascore_group(self, prompt: str, context: Any, candidates: Sequence[Any], *, errors: Literal["raise", "return"] = "return"):
        return self._results(await self._arequest("POST", "/v1/score_group", self._group_body(prompt, context, candidates)), errors)

    def info(self) -> dict:
        return self._request("GET", "/v1/info")

    def ready(self) -> bool:
        try:
            r = httpx.get(self.url + "/readyz", timeout=self.timeout)
        except httpx.TransportError:
            return False
        return r.status_code == 200

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise ServiceError(f"{self.url} was not ready after {timeout:g} s")
            time.sleep(0.2)

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    def __enter__(self) -> "RewardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
