"""Request bodies: read with the size limit enforced while streaming, parsed off the event loop.

Two forms (see ``nvrm.protocol``):

- ``application/json``: the request as JSON (bulk frames as base64 ``.npy``);
- ``multipart/form-data``: a ``request`` part with that JSON, plus binary
  parts that VIDEO objects name with ``{"part": ...}`` (raw ``.npy`` or
  encoded video), so frames travel as bytes, not base64 text.

Hostile JSON is answered with a 4xx before it costs memory or a traceback:
too many objects or values (counted on the raw bytes, outside strings: a flat
list of 25 million zeros has no braces), nesting deeper than Python's parser
allows, integers longer than it converts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import RequestError
from ...protocol import REQUEST_PART, ErrorCode

# A request is a handful of objects per item (the item, its context and its candidate):
# more braces than this many per allowed item is not a scoring request.
OBJECTS_PER_ITEM = 8
# Values (commas) per item besides its videos' ``times`` lists (at most ``times_per_item`` entries).
VALUES_PER_ITEM = 64
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[,{]')


def _structure_over(raw: bytes, max_objects: int, max_values: int) -> str | None:
    """Whether the JSON text has more objects or values than allowed, counting only outside strings
    (a prompt may hold any number of commas and braces). Reads at most about ``max_objects +
    max_values`` tokens: a hostile body is refused after a bounded scan, not after building it."""
    if raw.count(b"{") <= max_objects and raw.count(b",") <= max_values:
        return None  # the common case: even counting inside strings, it is under both bounds
    objects = values = 0
    for m in _TOKEN.finditer(raw):
        c = m.group()
        if c == b",":
            values += 1
            if values > max_values:
                return "values"
        elif c == b"{":
            objects += 1
            if objects > max_objects:
                return "objects"
    return None


@dataclass
class ParsedBody:
    """A request body, parsed: the JSON payload and the binary parts it may name."""

    payload: Any
    parts: dict[str, memoryview] = field(default_factory=dict)
    size: int = 0


async def read_body(request, max_bytes: int, timeout_s: float | None = None) -> bytearray:
    """The whole body, refused (413) as soon as it passes ``max_bytes``, and (408) when it has not
    arrived whole within ``timeout_s``: a client sending a byte every few seconds holds nothing for long.

    The body is written into one buffer of its declared length as it arrives, so an admitted body is
    held once (chunks joined at the end would hold it twice at the peak)."""
    import asyncio

    length = request.headers.get("content-length")
    too_large = RequestError("request body", f"is larger than the limit of {max_bytes} bytes", code=ErrorCode.TOO_LARGE)
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        raise too_large
    buf = bytearray(int(length)) if length is not None else bytearray()
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                end = size + len(chunk)
                if end > max_bytes:
                    raise too_large
                if length is not None and end <= len(buf):
                    buf[size:end] = chunk
                else:
                    del buf[size:]
                    buf += chunk
                size = end
    except TimeoutError:
        raise RequestError("request body", f"did not arrive whole within {timeout_s:g} s ({size} bytes came; --body-timeout-s)",
                           code=ErrorCode.REQUEST_TIMEOUT) from None
    if size < len(buf):  # the client sent less than it declared (the server cut the connection short)
        del buf[size:]
    return buf


def parse_json(raw: bytes, max_items: int, where: str = "request body", times_per_item: int = 1200) -> Any:
    """JSON with the guards above; a 400 (or 413) ``RequestError`` for anything unusable."""
    import json

    over = _structure_over(raw, OBJECTS_PER_ITEM * max_items + 16, (VALUES_PER_ITEM + times_per_item) * max_items + 64)
    if over is not None:
        raise RequestError(where, f"holds more JSON {over} than {max_items} items can need", code=ErrorCode.TOO_LARGE)
    try:
        return json.loads(raw)
    except RecursionError as e:
        raise RequestError(where, "is nested too deeply") from e
    except UnicodeDecodeError as e:
        raise RequestError(where, f"is not valid JSON (not UTF-8: {e.reason})") from e
    except json.JSONDecodeError as e:
        raise RequestError(where, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    except ValueError as e:  # e.g. an integer longer than Python converts
        raise RequestError(where, f"is not usable JSON ({' '.join(str(e).split())[:120]})") from e


def parse_multipart(raw: bytes, content_type: str, max_items: int, times_per_item: int = 1200) -> ParsedBody:
    """A ``multipart/form-data`` body: the ``request`` part as JSON, the other parts as raw bytes (views)."""
    from python_multipart.multipart import MultipartParser, parse_options_header

    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise RequestError("request body", "multipart/form-data needs a boundary")
    view = memoryview(raw)
    parts: dict[str, memoryview] = {}
    state: dict[str, Any] = {"headers": {}, "field": b"", "value": b"", "spans": []}

    def on_part_begin() -> None:
        state.update(headers={}, spans=[])

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["field"].lower()] = state["value"]
        state.update(field=b"", value=b"")

    def on_part_data(data: bytes, start: int, end: int) -> None:
        # spans of the body itself stay views (no copy); the parser's own lookbehind buffer is copied
        state["spans"].append(view[start:end] if data is raw else bytes(data[start:end]))

    def on_part_end() -> None:
        _, disp = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = disp.get(b"name", b"").decode("utf-8", "replace")
        if not name:
            raise RequestError("request body", "a multipart part has no name")
        if name in parts:
            raise RequestError("request body", f"multipart part {name!r} appears twice")
        spans = state["spans"]
        parts[name] = memoryview(spans[0]) if len(spans) == 1 else memoryview(b"".join(spans))

    callbacks = {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    }
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    try:
        parser.write(raw)
        parser.finalize()
    except RequestError:
        raise
    except Exception as e:  # noqa: BLE001 - the parser's own errors: a malformed body
        raise RequestError("request body", f"is not valid multipart/form-data ({' '.join(str(e).split())[:120]})") from e
    request = parts.pop(REQUEST_PART, None)
    if request is None:
        raise RequestError("request body", f"multipart/form-data needs a {REQUEST_PART!r} part with the JSON request")
    return ParsedBody(parse_json(bytes(request), max_items, f"{REQUEST_PART} part", times_per_item), parts, len(raw))


def parse_body(raw: bytes, content_type: str, max_items: int, times_per_item: int = 1200) -> ParsedBody:
    """Either form, by content type (JSON when none is given)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "multipart/form-data":
        return parse_multipart(raw, content_type, max_items, times_per_item)
    if kind not in ("", "application/json", "text/plain"):
        raise RequestError("request body", f"content type {kind!r} is not accepted; send application/json or multipart/form-data",
                           code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
    return ParsedBody(parse_json(raw, max_items, times_per_item=times_per_item), {}, len(raw))
