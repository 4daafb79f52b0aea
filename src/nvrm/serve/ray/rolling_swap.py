"""Rolling model swaps on Ray Serve (``nvrm serve --ray --admin-key-env``): one replica at a time.

    PUT /v1/models/NAME {"path": DIR} ─► the replica it reaches: ``RollingSwap.begin`` (409 while a roll runs)
        ─► swaps itself first (``model_swap.swap``: verify, memory, load beside, same contract, warm up, switch)
              refused? ─► ``done(ok=False)``: nothing else changed; the refusal is the answer
        ─► every other replica, polling ``claim`` every ``POLL_S``, swaps in its turn (one holds the turn at a time)
        ─► all on DIR: 200 with each replica's revision and its turn's times
           one fails: the target goes back to the previous folder, the swapped ones swap back in turn, and the
           answer says which replica refused and why

``RollingSwap`` holds no Ray: the driver wraps it as an actor (``ray.remote``) and hands its handle to every
replica. It keeps, per model name, the folder every replica should serve (``target``); a replica that
starts later (Ray Serve replacing one that died) loads those folders, so it joins at what is live.
Requests admitted by a replica before its switch finish on its old revision; every result names its
``model_revision``, so during a roll a trainer can tell the two apart (or pin one with ``expect_revision``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from ...protocol import ErrorCode
from ..http.messages import Reply

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often a replica asks whether it is its turn to swap."""
STALE_S = 10.0
"""A replica not heard from for this long is gone (Ray Serve replaced it): a roll does not wait for it."""


def _real(path: str | os.PathLike) -> str:
    return os.path.realpath(str(path))


class RollingSwap:
    """The roll's bookkeeping (a Ray actor in ``nvrm serve --ray``; plain Python, so it is tested without Ray)."""

    def __init__(self, targets: dict[str, str], clock=time.monotonic):
        self.target = {name: _real(p) for name, p in targets.items()}
        """name -> the folder every replica should serve"""
        self.seen: dict[str, tuple[float, dict[str, str]]] = {}
        """replica -> (when it last reported, name -> the folder it serves)"""
        self.turn: str | None = None
        """the replica swapping now (one at a time)"""
        self.roll: dict[str, Any] | None = None
        self.rolls = 0
        self.refused: set[tuple[str, str, str]] = set()
        """(replica, name, folder) turns that failed: never claimed again for that folder"""
        self._clock = clock

    # ----------------------------------------------------------- replicas

    def join(self, replica: str) -> dict[str, str]:
        """The folders a starting replica loads: what every replica serves now, or is rolling to."""
        return dict(self.target)

    def claim(self, replica: str, serving: dict[str, str]) -> tuple[str, str] | None:
        """A replica's poll (``serving``: name -> its folder). Its turn, ``(name, folder)``, when it serves another
        folder than the target and no other replica is swapping; else None."""
        serving = {n: _real(p) for n, p in serving.items()}
        self.seen[replica] = (self._clock(), serving)
        self._settle()
        if self.turn is not None:
            return None
        for name, where in self.target.items():
            if name in serving and serving[name] != where and (replica, name, where) not in self.refused:
                self.turn = replica
                if self.roll is not None:
                    self.roll["turns"].append({"replica": replica, "to": where, "started": time.time()})
                return name, where
        return None

    def done(self, replica: str, name: str, where: str, ok: bool, detail: str) -> None:
        """``replica``'s turn ended: it serves ``where`` now (``ok``; ``detail``: its revision), or could not (``detail``:
        why). A failure rolls the model back: the target returns to the previous folder, and the replicas that had
        swapped swap back, in turn."""
        where = _real(where)
        if self.turn == replica:
            self.turn = None
        if replica in self.seen and ok:
            self.seen[replica][1][name] = where
        if not ok:
            self.refused.add((replica, name, where))
        roll = self.roll
        if roll is not None and roll["state"] in ("rolling", "rolling back"):
            for t in reversed(roll["turns"]):
                if t["replica"] == replica and "finished" not in t:
                    t.update(finished=time.time(), ok=ok, **({"revision": detail} if ok else {"error": detail}))
                    break
            if not ok and roll["state"] == "rolling" and where == roll["path"]:
                roll.update(state="rolling back", error=f"replica {replica}: {detail}")
                self.target[name] = roll["previous"]
            elif not ok:  # a replica could not swap back: the roll ends with it on the new folder
                roll.update(state="failed", error=f"{roll['error']}; replica {replica} could not swap back: {detail}")
        self._settle()

    # ----------------------------------------------------------- the PUT

    def begin(self, replica: str, name: str, where: str) -> dict[str, Any] | None:
        """Start rolling ``name`` to ``where``, ``replica`` (the one the PUT reached) first; None while a roll runs."""
        self._settle()
        if self.turn is not None or (self.roll is not None and self.roll["state"] in ("rolling", "rolling back")):
            return None
        self.rolls += 1
        self.refused.clear()
        where = _real(where)
        self.roll = {"id": self.rolls, "name": name, "path": where, "previous": self.target[name], "state": "rolling",
                     "error": None, "turns": [{"replica": replica, "to": where, "started": time.time()}]}
        self.target[name] = where
        self.turn = replica
        return dict(self.roll)

    def status(self, roll_id: int) -> dict[str, Any] | None:
        """The roll ``roll_id``: its state (rolling, rolling back, done, failed), its turns and, when it failed, why."""
        self._settle()
        if self.roll is None or self.roll["id"] != roll_id:
            return None
        return {**self.roll, "turns": [dict(t) for t in self.roll["turns"]]}

    def _settle(self) -> None:
        """A roll ends once no turn is held and every live replica serves the target."""
        now = self._clock()
        for replica in [r for r, (t, _) in self.seen.items() if now - t > STALE_S and r != self.turn]:
            del self.seen[replica]
        roll = self.roll
        if roll is None or roll["state"] not in ("rolling", "rolling back") or self.turn is not None:
            return
        name, want = roll["name"], self.target[roll["name"]]
        if all(serving.get(name, want) == want or (r, name, want) in self.refused for r, (_, serving) in self.seen.items()):
            roll["state"] = "done" if roll["state"] == "rolling" else "failed"


def serving_paths(models) -> dict[str, str]:
    """name -> the folder each served model was loaded from (the replica's report to ``RollingSwap.claim``)."""
    return {e.name: str(e.path) for e in models.registry.all() if e.path is not None and not e.retired}


async def poll(swaps, replica: str, models) -> None:
    """A replica's part in every roll (a task of its app's lifespan): swap in its turn, report, repeat."""
    from ..models.model_swap import swap

    while True:
        await asyncio.sleep(POLL_S)
        if models.model is None and not models.registry.entries:
            continue  # not loaded yet
        try:
            job = await swaps.claim.remote(replica, serving_paths(models))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the actor unreachable for a moment: ask again next time
            log.warning("rolling swaps: the rolling-swap actor did not answer", exc_info=True)
            continue
        if job is None:
            continue
        name, where = job
        reply = await swap(models, name, where)
        ok, detail = _outcome(reply)
        log.info("rolling swap: replica %s, model %s -> %s: %s", replica, name, where, detail)
        await swaps.done.remote(replica, name, where, ok, detail)


def _outcome(reply: Reply) -> tuple[bool, str]:
    if reply.status == 200:
        return True, reply.body["revision"]
    err = reply.body.get("error", {}) if isinstance(reply.body, dict) else {}
    return False, str(err.get("message") or reply.body)


def rolling_swap(swaps, replica: str, *, timeout_s: float = 1800.0):
    """The ``PUT /v1/models/{name}`` of a replica under Ray Serve: this replica swaps first, then the others in turn;
    answers once every replica serves the new folder (or the roll was undone)."""
    from ..models.model_swap import swap

    async def run(models, name: str, where: str) -> Reply:
        started = await swaps.begin.remote(replica, name, where)
        if started is None:
            return Reply.error(ErrorCode.SWAP_IN_PROGRESS, "another model swap is rolling over the replicas; retry once it has finished")
        try:
            reply = await swap(models, name, where)
        except BaseException:
            await swaps.done.remote(replica, name, where, False, "this replica's swap raised")
            raise
        ok, detail = _outcome(reply)
        await swaps.done.remote(replica, name, where, ok, detail)
        if not ok:
            return reply  # refused on the first replica: no replica changed
        deadline = time.monotonic() + timeout_s
        while True:
            state = await swaps.status.remote(started["id"])
            if state["state"] in ("done", "failed") or time.monotonic() > deadline:
                break
            await asyncio.sleep(POLL_S / 2)
        turns = [{k: t.get(k) for k in ("replica", "to", "revision", "error", "started", "finished")} for t in state["turns"]]
        if state["state"] == "done":
            return Reply(200, {**reply.body, "rolled": "replica by replica", "replicas": turns})
        if state["state"] == "failed":
            return Reply.error(ErrorCode.INTERNAL, f"model {name!r}: the roll to {where} failed, and the replicas that had swapped "
                               f"were sent back to {state['previous']}: {state['error']}")
        return Reply.error(ErrorCode.UNAVAILABLE, f"model {name!r}: the roll to {where} is still {state['state']} after "
                           f"{timeout_s:.0f} s; GET /v1/models on the replicas shows their revisions", status=504)

    return run
