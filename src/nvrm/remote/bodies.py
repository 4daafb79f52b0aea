"""Building a scoring request for ``nvrm serve`` and planning its exchanges, without I/O.

- ``RequestBody``: a request being built: JSON, plus the binary parts its VIDEO objects name.
  In-memory clips are cut to the frames the server's contract samples (``presample``), and
  contexts go by content hash when the server holds them (``context_refs``).
- ``plan``: the exchanges of one scoring call as a generator: ask about unseen contexts, post
  the request, re-send it inline after a 409 ``context_unknown``. ``http.Transport`` runs it with
  a sync or an async HTTP client.

Torch-free, like the whole client.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any, Callable, Generator, Literal

from ..clip import Clip
from ..errors import InputError, ServiceError
from ..protocol import REQUEST_PART, ROUTE_HEADER, ErrorCode, context_ref, encode_frames, npy_bytes

Encoding = Literal["binary", "json"]

Step = tuple[str, str, dict[str, Any]]
"""One exchange: (method, path, httpx keyword arguments)."""


class RequestBody:
    """A request being built: JSON, plus the binary parts its VIDEO objects name.

    A context (sampled clip or video bytes) goes by ``{"ref": hash}`` when ``holds(hash)`` says the
    server has it, else inline (the server then keeps it under that hash for later requests).
    ``inline=True`` sends every context inline (the retry after the server lost one)."""

    def __init__(self, transport: Encoding, sampling: "tuple[Any, str] | None" = None, holds=None, inline: bool = False):
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
        from ..video.sampling import plan_candidate, plan_context

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


class KnownRefs:
    """The context refs a client has seen held by the server (most recent last, bounded)."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._refs: "OrderedDict[str, None]" = OrderedDict()

    def __contains__(self, ref: str) -> bool:
        return ref in self._refs

    def held(self, ref: str) -> bool:
        """Whether ``ref`` was seen held (now most recent); no request is made."""
        if ref in self._refs:
            self._refs.move_to_end(ref)
            return True
        return False

    def remember(self, ref: str) -> None:
        self._refs[ref] = None
        self._refs.move_to_end(ref)
        while len(self._refs) > self.limit:
            self._refs.popitem(last=False)

    def forget(self, ref: str) -> None:
        self._refs.pop(ref, None)


def plan(path: str, build: Callable[[bool], tuple[RequestBody, dict[str, Any]]], known: KnownRefs) -> Generator[Step, Any, Any]:
    """The exchanges of one scoring call: yields ``(method, path, kwargs)``, is sent each answer (or thrown
    its ``ServiceError``), and returns the final answer.

    Contexts this client has not seen held are asked about first (``GET /v1/contexts/<hash>``, routed
    like the requests that name them); held ones go by ref, the rest inline (the server keeps them).
    If the server lost one meanwhile (409 ``context_unknown``: evicted, or another replica), the
    request goes again with every context inline."""
    body, payload = build(False)
    unknown = [ref for ref in body.refs if ref not in known]
    for ref in unknown:
        try:
            yield "GET", f"/v1/contexts/{ref}", {"headers": {ROUTE_HEADER: ref}}
            known.remember(ref)
        except ServiceError as e:
            if e.code not in (ErrorCode.CONTEXT_UNKNOWN, None) and (e.status or 0) not in (404, 405):
                raise  # anything but "not held" (or a server without the store)
    if any(ref in known for ref in unknown):
        body, payload = build(False)  # some of them go by ref after all
    try:
        out = yield "POST", path, body.request(payload)
    except ServiceError as e:
        if e.code != ErrorCode.CONTEXT_UNKNOWN or not body.by_ref:
            raise
        for ref in body.refs:
            known.forget(ref)
        body, payload = build(True)
        out = yield "POST", path, body.request(payload)
    for ref in body.refs:
        known.remember(ref)
    return out
