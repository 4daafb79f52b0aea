"""One shape for every wire protocol the service speaks (after LitServe's ``LitSpec``):

    decode   the wire (a body and its headers) -> typed work, in a worker thread, over a ``ParseContext``
    encode   typed results (``serving.Scored``, or a job's outcome) -> the protocol's answer, a ``Reply``
    attach_router(app)   its endpoints; ``protected``: the path prefixes the one bearer guard covers

A protocol never reads another's JSON: it gets typed results from ``Serving`` and encodes them itself. The common
way of a scoring request (read the body under its reservation, decode, admit and score, encode) is ``answer``;
``setup`` and ``close`` hold what a protocol needs beside the model (cosmos-rl's latent decoder).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, Mapping, TypeVar

from fastapi import FastAPI

from ..admission.requests import ParseContext, Work
from ..http.messages import PendingBody, Reply
from ..serving import Serving

D = TypeVar("D")


@dataclass(frozen=True)
class Wire:
    """A request as it came off the wire: its body, content type and headers (lower-case names)."""

    raw: bytes
    content_type: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


class ProtocolSpec(ABC, Generic[D]):
    """A wire protocol over ``serving``: ``decode``, ``encode`` and its endpoints."""

    name: str = ""
    """What it is called in docs and logs."""
    protected: tuple[str, ...] = ()
    """Path prefixes of its endpoints that need the API key (``http.middleware.BearerGuard``)."""

    def __init__(self, serving: Serving):
        self.serving = serving

    @abstractmethod
    def decode(self, ctx: ParseContext, wire: Wire) -> D:
        """The wire as typed work (runs in a worker thread); ``InputError`` names what is wrong."""

    @abstractmethod
    def encode(self, request: Any, outcome: Any) -> Reply:
        """The protocol's answer from a typed ``outcome``; ``request`` is what it answers: the decoded request (a scoring
        route's), or what a fetch asked for (cosmos-rl's pull type)."""

    @abstractmethod
    def attach_router(self, app: FastAPI) -> None:
        """Mount its endpoints on ``app``."""

    def setup(self, model) -> None:
        """Once the model is loaded: load what the protocol needs beside it (nothing by default)."""

    def close(self) -> None:
        """At shutdown, after the drain: let go of what ``setup`` started (nothing by default)."""

    def work_of(self, decoded: D) -> Work | None:
        """The work to score for ``decoded`` (None: nothing to score; ``encode`` answers with outcome None)."""
        return decoded if isinstance(decoded, Work) else None

    async def answer(self, body: PendingBody, what: str) -> Reply:
        """A scoring request end to end: the body read under its reservation (``what`` names it in refusals), decoded in a
        thread, its work admitted and scored, the typed results encoded; a refusal on the way is the answer."""

        async def decoded(raw: bytes, reserved: int) -> Reply:
            ctx = self.serving.parse_context()
            d = await asyncio.to_thread(self.decode, ctx, Wire(raw, body.content_type, body.headers))
            work = self.work_of(d)
            if work is None:
                return self.encode(d, None)
            outcome = await self.serving.admit(work, reserved)
            return outcome if isinstance(outcome, Reply) else self.encode(d, outcome)

        return await self.serving.with_body(body, what, decoded)


def handed_out(result: Any, weight: float | None) -> float:
    """The reward a protocol whose clients cannot ask for it hands out: ``reward - weight * uncertainty`` under ``--conservative``
    (every served model has a guard then: refused at start), else the raw reward."""
    return float(result.reward) if weight is None else float(result.conservative(weight))


def both_values(result: Any) -> dict[str, float]:
    """The raw reward and the uncertainty beside a handed-out one (empty without a guard), for answers that can carry them."""
    return {} if getattr(result, "uncertainty", None) is None else {"raw_reward": float(result.reward), "uncertainty": float(result.uncertainty)}
