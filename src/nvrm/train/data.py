"""Which pairs a step trains on, and how their videos reach the model.

Planning is pure and global (``StepPlan``): an epoch's order is a permutation seeded by the seed and
the epoch, a micro-batch is ``batch_pairs`` consecutive pairs of it, a step ``grad_accum``
micro-batches, and rank r of W takes the pairs at positions r, r+W, ... of each micro-batch. So the
same global batch runs at any world size, no pair is seen twice, no rank pads, and counters kept
in global micro-batches resume at another world size.

``Feed`` turns pairs into encoded sequences through the model's engine, with each video from one
of three places (``mode``):

- ``files``: decoded from its file when its pair comes up (bounded memory, every epoch again);
- ``memory``: prepared once up front and kept (``--cache-inputs``: small data only);
- ``store``: read from a prepared-input store (``nvrm.train.store``): bounded memory at any scale.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import NvrmError
from ..prefs.pairs import Pair


@dataclass(frozen=True)
class StepPlan:
    """The global schedule of a run (pure): pairs, micro-batches, steps."""

    n_pairs: int
    batch_pairs: int
    grad_accum: int
    seed: int

    @property
    def micro_per_epoch(self) -> int:
        return math.ceil(self.n_pairs / self.batch_pairs)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.micro_per_epoch / self.grad_accum)

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + 1_000 * epoch).permutation(self.n_pairs)

    def micro_batches(self, epoch: int) -> list[list[int]]:
        """Pair indices of each micro-batch of ``epoch``, in order."""
        order = self.order(epoch).tolist()
        return [order[i : i + self.batch_pairs] for i in range(0, self.n_pairs, self.batch_pairs)]

    def step_batches(self, epoch: int, micro: int) -> list[list[int]]:
        """The micro-batches of the step that starts at global micro-batch ``micro`` of ``epoch``."""
        batches = self.micro_batches(epoch)
        return batches[micro : micro + self.grad_accum]


def rank_share(indices: Sequence[int], rank: int, world: int) -> list[int]:
    """The pairs of one micro-batch that rank ``rank`` of ``world`` trains on (pure; disjoint, no padding)."""
    return list(indices[rank::world])


@dataclass
class EncodedPair:
    """A pair's two sequences, encoded; ``weight`` 0 for the filler a rank with nothing left runs."""

    pair: Pair | None
    chosen: Any
    rejected: Any
    weight: float = 1.0
    index: int = -1


def pair_videos(p: Pair) -> list[tuple[str, str]]:
    """(path, role) of every video a pair names."""
    keys = [(p.context, "context"), (p.chosen, "candidate"), (p.rejected, "candidate")]
    return keys + [(p.rejected_context, "context")] if p.rejected_context else keys


def pairs_digest(pairs: Sequence[Pair]) -> str:
    """sha256 over every field of every pair, in order: two ranks train on the same pairs when it agrees."""
    h = hashlib.sha256()
    for p in pairs:
        h.update(json.dumps(dataclasses.asdict(p), sort_keys=True).encode() + b"\n")
    return h.hexdigest()


class Feed:
    """Pairs -> encoded pairs through the engine, each video from ``files``, ``memory`` or a ``store``."""

    def __init__(self, model, mode: str = "files", store=None, say: Callable[[str], None] = print):
        if mode not in ("files", "memory", "store"):
            raise ValueError(mode)
        if mode == "store" and store is None:
            raise ValueError("mode='store' needs a StoreReader")
        self.model = model
        self.mode = mode
        self.store = store
        self.say = say
        self._cache: dict[tuple[str, str], Any] = {}
        self._filler: EncodedPair | None = None

    def ready(self, pairs: Sequence[Pair], what: str) -> list[Pair]:
        """The pairs training can use: in ``memory`` mode every video is prepared now (bad ones found before
        training); in ``store`` mode a video missing from the store is reported. Others are found when
        their pair comes up."""
        if self.mode == "memory":
            todo = [k for k in dict.fromkeys(k for p in pairs for k in pair_videos(p)) if k not in self._cache]
            tasks = [self.model.engine.submit_video(src, role) for src, role in todo]
            for key, task in zip(todo, tasks):
                try:  # training needs the patches, grids and times, not the images: half the memory
                    self._cache[key] = dataclasses.replace(task.result(), images=())
                except NvrmError as e:
                    self._cache[key] = e
        out = []
        for p in pairs:
            problem = self._problem(p)
            if problem is None:
                out.append(p)
            else:
                self.say(f"nvrm train: skipped {what} pairs line {p.line}: {problem}")
        return out

    def _problem(self, p: Pair) -> str | None:
        if self.mode == "memory":
            bad = next((self._cache[k] for k in pair_videos(p) if isinstance(self._cache.get(k), NvrmError)), None)
            return None if bad is None else str(bad)
        if self.mode == "store":
            missing = self.store.missing(pair_videos(p))
            return None if not missing else self.store.why_missing(*missing[0])
        return None

    def _video(self, source: str, role: str) -> Any:
        if self.mode == "memory":
            hit = self._cache[(source, role)]
            if isinstance(hit, NvrmError):
                raise hit
            return hit
        if self.mode == "store":
            return self.store.get(source, role)
        return source

    def submit(self, pairs: Sequence[tuple[int, Pair]]) -> list[tuple[int, Pair, Any, Any]]:
        """Item tasks for both sides of each (index, pair)."""
        tasks = []
        engine = self.model.engine
        for i, p in pairs:
            try:
                (cp, cc, cv), (rp, rc, rv) = p.sides
                chosen = (cp, self._video(cc, "context"), self._video(cv, "candidate"))
                rejected = (rp, self._video(rc, "context"), self._video(rv, "candidate"))
            except NvrmError as e:
                tasks.append((i, p, e, None))
                continue
            tasks.append((i, p, engine.submit_item(*chosen), engine.submit_item(*rejected)))
        return tasks

    def collect(self, tasks) -> list[EncodedPair]:
        """The encoded pairs of ``tasks``; a pair that failed is reported and left out."""
        out = []
        for i, p, chosen, rejected in tasks:
            try:
                if isinstance(chosen, NvrmError):
                    raise chosen
                out.append(EncodedPair(p, _result(chosen).encoded, _result(rejected).encoded, 1.0, i))
            except NvrmError as e:
                self.say(f"nvrm train: skipped pairs line {p.line}: {e}")
        return out

    def filler(self) -> EncodedPair:
        """A pair of blank frames with weight 0: what a rank whose pairs all failed runs, so every rank takes
        part in the step's gradient exchange (its loss contributes nothing)."""
        if self._filler is None:
            from ..clip import Clip

            c = self.model.contract
            side = 64
            blank = Clip(np.zeros((int(c.candidate_frames), side, side, 3), np.uint8), fps=c.sample_fps, name="filler")
            ctx = Clip(np.zeros((1, side, side, 3), np.uint8), fps=c.sample_fps, name="filler-context")
            item = self.model.engine.submit_item("filler", ctx, blank).result().encoded
            self._filler = EncodedPair(None, item, item, 0.0)
        return self._filler


def _result(task: Any) -> Any:
    return task.result() if isinstance(task, Future) else task
