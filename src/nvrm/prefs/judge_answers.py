"""A chat judge's answer read defensively (pure): checked shape by shape once it is in.

A judge server is not trusted to be well behaved. Its body arrives bounded (``nvrm.remote.exchange``
decodes identity, gzip or deflate with a bound on the *decoded* size, so a gzip bomb stops at
``--max-answer-kb`` instead of inflating in memory). The decoded text is read here as a chat completion
(JSON) or a server-sent event stream of chunks; every field is checked for its type before it is used,
so an answer of the wrong shape is one error with its reason, never an exception:

- ``choices`` a non-empty list of objects, ``message`` (``delta`` in a stream) an object;
- ``content`` text, null, or a list of text parts (``[{"type": "text", "text": ...}]``, an OpenAI form);
- ``usage`` kept only when its token counts are whole numbers from 0 to ``MAX_TOKENS``;
- ``logprobs`` kept only when the run asked for them.

An empty, blank or HTML 200 (a proxy's or a login page, a server still starting) or a body that is
not JSON at all says nothing about the pair: ``retry`` is set, and the run asks again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_TOKENS = 10**9
"""The most tokens one answer's usage may report; more is not a count."""


@dataclass
class Reading:
    """What an answer's body says: text, usage and logprobs, or why it cannot be read."""

    text: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    logprobs: Any = None
    error: str | None = None
    retry: bool = False
    """The body says nothing about the pair (empty, HTML, not JSON): ask again."""


def _loads(text: str) -> tuple[Any, str | None]:
    """(value, None) or (None, why it is not JSON); never raises, also on input nested too deeply."""
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "JSON nested too deeply"
    except ValueError as e:
        return None, f"not JSON ({e})"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def clean_usage(usage: Any) -> dict[str, int]:
    """The token counts of a ``usage`` object; {} unless every count given is a whole number in [0, MAX_TOKENS] and prompt_tokens is one."""
    if not isinstance(usage, dict):
        return {}
    out = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        v = usage.get(key)
        if v is None and key != "prompt_tokens":
            continue
        if type(v) is not int or not 0 <= v <= MAX_TOKENS:
            return {}
        out[key] = v
    return out


def content_text(content: Any, where: str = "'content'") -> tuple[str, str | None]:
    """(text, None) of a message's content: text, null, or a list of text parts; ("", why) for anything else."""
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    if isinstance(content, list):
        texts = []
        for n, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                return "", f"{where} part {n} is {_kind(part)}, not a text part"
            if part.get("type", "text") in ("text", "output_text"):
                texts.append(part.get("text", ""))
        return "".join(texts), None
    return "", f"{where} is {_kind(content)}, not text"


def _completion(data: Any, logprobs: bool) -> Reading:
    if not isinstance(data, dict):
        return Reading(error=f"the judge's answer is {_kind(data)}, not a chat completion object")
    if "choices" not in data and "error" in data:
        return Reading(error=f"the judge's answer carried an error: {str(data['error'])[:300]}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return Reading(error=f"the judge's answer is not a chat completion: 'choices' is {_kind(choices)}, not a non-empty list")
    choice = choices[0]
    if not isinstance(choice, dict):
        return Reading(error=f"the judge's answer is not a chat completion: 'choices[0]' is {_kind(choice)}, not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        return Reading(error=f"the judge's answer is not a chat completion: 'message' is {_kind(message)}, not an object")
    text, why = content_text(message.get("content"))
    if why:
        return Reading(error=f"the judge's answer is not a chat completion: {why}")
    return Reading(text=text, usage=clean_usage(data.get("usage")), logprobs=choice.get("logprobs") if logprobs else None)


def _stream(body: str, logprobs: bool) -> Reading:
    """A server-sent event stream of chat chunks; one chunk of the wrong shape makes the answer an error."""
    out = Reading(text="")
    parts: list[str] = []
    for line in body.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk, why = _loads(payload)
        if why or not isinstance(chunk, dict):
            return Reading(error=f"the judge's stream has a chunk that is {why or _kind(chunk)}, not an object: {payload[:80]!r}")
        if "error" in chunk:
            return Reading(error=f"the judge's stream carried an error: {str(chunk['error'])[:300]}")
        if chunk.get("usage") is not None:
            out.usage = clean_usage(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            return Reading(error=f"the judge's stream has 'choices' that is {_kind(choices)}, not a list")
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(choice, dict) or not isinstance(delta, (dict, type(None))):
                what = f"a choice that is {_kind(choice)}" if not isinstance(choice, dict) else f"a 'delta' that is {_kind(delta)}"
                return Reading(error=f"the judge's stream has {what}, not an object")
            text, why = content_text((delta or {}).get("content"), "a delta's 'content'")
            if why:
                return Reading(error=f"the judge's stream has {why}")
            parts.append(text)
            if logprobs and choice.get("logprobs"):
                out.logprobs = choice["logprobs"]
    out.text = "".join(parts)
    return out


def read_chat_answer(body: str, content_type: str, logprobs: bool) -> Reading:
    """What a 200 answer's decoded ``body`` says (``logprobs``: whether the run asked for them); never raises."""
    head = body.lstrip()[:64].lower()
    if not head:
        return Reading(error="the judge answered 200 with an empty body", retry=True)
    if "text/html" in content_type.lower() or head.startswith(("<!doctype", "<html", "<?xml", "<")):
        excerpt = " ".join(body[:1000].split())[:120]
        return Reading(error=f"the judge answered 200 with an HTML page, not a chat completion: {excerpt!r}", retry=True)
    if "text/event-stream" in content_type.lower() or head.startswith("data:"):
        return _stream(body, logprobs)
    data, why = _loads(body)
    if why:
        nested = why.startswith("JSON nested")
        return Reading(error=f"the judge's answer is {why}: {' '.join(body[:1000].split())[:120]!r}", retry=not nested)
    return _completion(data, logprobs)
