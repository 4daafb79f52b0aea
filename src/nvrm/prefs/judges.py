"""The judges ``nvrm prefs judge`` asks: vision-language models behind an OpenAI-compatible chat API, or nvrm itself.

A judge is given as a spec (``--judge``):

- ``http://host:8000/v1``: a chat-completions server (vLLM, SGLang, a hosted API, ``transformers serve``);
- ``name=qwen,url=http://host:8000/v1,model=Qwen/Qwen3-VL-8B-Instruct,key_env=QWEN_KEY``: the same, named;
- ``nvrm:PATH`` (a bundle, in process) or ``nvrm+http://host:8000`` (a running ``nvrm serve``): a reward
  model as the judge, for auditing labels or self-training: the higher reward wins.

A chat judge is asked for a structured verdict (``response_format`` with a JSON schema) where the
server takes it (``structured=auto`` drops it for the run on the first server that refuses it), at
temperature 0. Answers may come as JSON or as a server-sent event stream (``transformers serve``
streams even when asked not to). ``--timeout-s`` bounds each request as a whole (connecting, sending
and every byte of the answer), and an answer is read, decoded, no further than ``--max-answer-kb``
(``nvrm.remote.exchange``). 429, 5xx, timeouts, connection errors and 200s that are no answer (empty, HTML,
not JSON) are retried with backoff (``Retry-After`` honoured). 3xx (not followed), 401, 403, 404 and
405 say nothing about the pair (a wrong key, URL or model name): such judgments are not written, and
``--resume`` asks them again once fixed. Other 4xx, and answers of the wrong shape, are the pair's
final answer (a failed row with the reason).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from ..errors import ConfigError, Retryable, ServiceError
from ..remote.exchange import Backoff, Received, TooSlow, aexchange, aretrying, retry_after
from ..scoring.items import sigmoid
from .judge_answers import read_chat_answer

VERDICT_SCHEMA = {"type": "object", "properties": {"winner": {"type": "string", "enum": ["first", "second", "tie"]}}, "required": ["winner"],
                  "additionalProperties": False}
RETRY = {429, 500, 502, 503, 504}
NOT_THIS_PAIR = {401, 403, 404, 405, 408}
"""Answers about the server or the credentials, not the pair: not written as the pair's judgment."""
BACKOFF = Backoff(first_s=0.5, most_s=8.0)
"""Waits between a judgment's tries: 0.5 s doubling to 8 s, with jitter (or the server's ``Retry-After``, to 30 s)."""


@dataclass(frozen=True)
class JudgeSpec:
    """One judge, parsed from ``--judge``."""

    name: str
    kind: str
    """``chat`` or ``nvrm``."""
    url: str = ""
    model: str = "default"
    key_env: str | None = None
    path: str | None = None

    @classmethod
    def parse(cls, text: str, default_key_env: str | None = None) -> "JudgeSpec":
        if text.startswith("nvrm:") and text[5:]:
            return cls(f"nvrm:{Path(text[5:]).name or text[5:]}", "nvrm", path=text[5:])
        if text.startswith("nvrm+http"):
            return cls(f"nvrm@{urlparse(text[5:]).netloc}", "nvrm", url=text[5:], key_env=default_key_env)
        fields = {"url": text} if "=" not in text else dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        unknown = sorted(set(fields) - {"name", "url", "model", "key_env"})
        url = fields.get("url", "")
        if unknown or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--judge {text}: give a chat server's URL (http://host:port/v1), "
                              "name=...,url=...,model=...,key_env=..., nvrm:BUNDLE or nvrm+URL")
        name = fields.get("name") or (urlparse(url).hostname or "judge") + (f":{urlparse(url).port}" if urlparse(url).port else "")
        return cls(name, "chat", url.rstrip("/"), fields.get("model", "default"), fields.get("key_env") or default_key_env)


@dataclass
class Answer:
    """What one request brought back."""

    text: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    logprobs: Any = None
    error: str | None = None
    transient: bool = False
    """The error may go away on another run (network, 429, 5xx, timeouts)."""
    attempts: int = 0
    seconds: float = 0.0
    confidence: float | None = None
    """Set by nvrm's own judge only (from its two rewards); a chat judge's confidence comes from its logprobs."""


def reachable(url: str, timeout: float = 5.0) -> str | None:
    """Why the server at ``url`` cannot be reached (a TCP connection refused or timing out), or None."""
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout):
            return None
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"


class ChatJudge:
    """Chat completions, retried; one ``ask`` per judgment."""

    def __init__(self, spec: JudgeSpec, *, timeout_s: float, retries: int, structured: str = "auto", logprobs: bool = False,
                 max_tokens: int = 64, concurrency: int = 4, max_answer_kb: int = 1024, http: httpx.AsyncClient | None = None):
        self.spec = spec
        self.timeout_s = timeout_s
        self.retries = retries
        self.structured = structured
        self.logprobs = logprobs
        self.max_tokens = max_tokens
        self.max_answer_kb = max_answer_kb
        key = os.environ.get(spec.key_env) if spec.key_env else None
        if spec.key_env and not key:
            raise ConfigError(f"judge {spec.name}: the environment variable {spec.key_env} (its API key) is empty or unset")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = http or httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency))
        self.notes: list[str] = []
        # the run's first request goes alone: a server that loads its model on first use loads it once. transformers
        # serve loads it in each request that finds it missing, and loads at once break one another (meta tensors,
        # then 500 on every request)
        self._first_sent = False
        self._first_answered = asyncio.Event()

    def body(self, content: list[dict]) -> dict[str, Any]:
        """The chat-completions request for one judgment."""
        body: dict[str, Any] = {"model": self.spec.model, "messages": [{"role": "user", "content": content}], "max_tokens": self.max_tokens,
                                "temperature": 0.0, "stream": False}
        if self.structured in ("auto", "json_schema"):
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA, "strict": True}}
        if self.logprobs:
            body.update(logprobs=True, top_logprobs=5)
        return body

    async def _exchange(self, body: dict[str, Any]) -> tuple[Received | None, str | None]:
        """(the answer, None) or (None, why no answer came): one request through ``remote.exchange``, its answer decoded as
        it streams in, read no further than --max-answer-kb, and the whole exchange (connecting, sending and every byte of
        the answer) ended at --timeout-s, so a server trickling bytes is cut off too."""
        try:
            return await aexchange(self.http, "POST", self.spec.url + "/chat/completions", limit=self.max_answer_kb * 1024,
                                   deadline=time.monotonic() + self.timeout_s, json=body, headers=self.headers), None
        except TooSlow:
            return None, f"ReadTimeout: the whole answer did not come within --timeout-s {self.timeout_s:g} s"
        except httpx.TransportError as e:  # httpx's timeouts too
            return None, f"{type(e).__name__}: {' '.join(str(e).split())[:200] or 'no answer'}"

    async def _attempt(self, body: dict[str, Any]) -> tuple[Received | None, str | None]:
        """``_exchange``; no other request is sent before the run's first has its answer (or its failure)."""
        if self._first_sent:
            await self._first_answered.wait()
            return await self._exchange(body)
        self._first_sent = True
        try:
            return await self._exchange(body)
        finally:
            self._first_answered.set()

    async def ask(self, content: list[dict]) -> Answer:
        """One judgment: retried with backoff after 429, 5xx, timeouts, dropped connections and 200s that are no answer."""
        out, t0 = Answer(), time.perf_counter()
        try:
            async for attempt in aretrying(self.retries, BACKOFF):
                with attempt:
                    out.attempts += 1
                    await self._try(content, out)
        except Retryable:
            out.error, out.transient = f"{out.error} (after {out.attempts} attempts)", True
        out.seconds = time.perf_counter() - t0
        return out

    async def _try(self, content: list[dict], out: Answer) -> None:
        """One try: ``out`` holds the judgment or a final failure when it returns; ``Retryable`` (``out.error`` saying
        why) when another try may answer (429, 5xx, no answer, a 200 that is no answer)."""
        while True:
            body = self.body(content)
            got, out.error = await self._attempt(body)
            if got is None:
                raise Retryable(ServiceError(out.error or ""), None)
            if got.status == 200:
                if self._read(got, out):
                    return
                raise Retryable(ServiceError(out.error or ""), retry_after(got.headers))
            if got.status in (400, 422) and "response_format" in body and self.structured in ("auto", "none"):
                if self.structured == "auto":  # this server takes no response_format: a strict parser reads the answers
                    self.structured = "none"
                    self.notes.append(f"{self.spec.name}: the server refused response_format ({got.status}); answers are read with the strict parser")
                continue  # asked again at once without it: not a try of its own
            out.error = f"the judge answered {got.status}: {' '.join(got.body.text()[:1000].split())[:200]}"
            if 300 <= got.status < 400:
                out.error += f" (a redirect to {str(got.headers.get('location', ''))[:120]!r}, not followed: give the URL it names)"
            if got.status in RETRY:
                raise Retryable(ServiceError(out.error), retry_after(got.headers))
            # the key, the URL or the model: fixed once, asked again by --resume
            out.transient = got.status in NOT_THIS_PAIR or 300 <= got.status < 400
            return

    def _read(self, got: Received, out: Answer) -> bool:
        """Fill ``out`` from a 200 answer; False (``out.error`` says why) when it is no answer and is asked again."""
        if got.body.error:
            out.error = got.body.error
            return True
        if got.body.too_large:
            out.error = f"the judge's answer is larger than --max-answer-kb {self.max_answer_kb} (decoded); read no further"
            return True
        reading = read_chat_answer(got.body.text(), got.headers.get("content-type", ""), self.logprobs)
        out.text, out.usage, out.logprobs, out.error = reading.text, reading.usage, reading.logprobs, reading.error
        if reading.error:
            out.text = None
        return not reading.retry

    async def close(self) -> None:
        await self.http.aclose()


class RewardJudge:
    """nvrm as a judge: both continuations scored in one group (one prefill); the higher reward wins."""

    def __init__(self, spec: JudgeSpec):
        from ..source.reward_source import RewardSource

        self.spec = spec
        key = os.environ.get(spec.key_env) if spec.key_env else None
        self.source = RewardSource(spec.path or spec.url, api_key=key)
        self.notes: list[str] = []
        self._local = asyncio.Lock() if not self.source.remote else None  # one forward at a time in this process

    async def compare(self, prompt: str, context: str, first: str, second: str) -> Answer:
        from ..errors import NvrmError, Unavailable

        t0 = time.perf_counter()
        try:
            if self._local is not None:
                async with self._local:
                    results, _ = await asyncio.to_thread(self.source.score, [prompt, prompt], [context, context], [first, second])
            else:
                results, _ = await asyncio.to_thread(self.source.score, [prompt, prompt], [context, context], [first, second])
        except NvrmError as e:
            return Answer(error=str(e), transient=isinstance(e, Unavailable), seconds=time.perf_counter() - t0, attempts=1)
        bad = [r for r in results if isinstance(r, BaseException)]
        if bad:
            return Answer(error=str(bad[0]), transient=isinstance(bad[0], Unavailable), seconds=time.perf_counter() - t0, attempts=1)
        r1, r2 = results[0].reward, results[1].reward
        winner = "first" if r1 > r2 else "second" if r2 > r1 else "tie"
        raw = json.dumps({"winner": winner, "reward_first": r1, "reward_second": r2})
        confidence = sigmoid(abs(r1 - r2))
        return Answer(text=raw, confidence=confidence, seconds=time.perf_counter() - t0, attempts=1)

    async def close(self) -> None:
        return None
