"""The service's memory model: every request reserves the bytes it can hold before it holds them.

A request reserves, before its body is read, the body's declared size (``content-length``, else
``--max-body-mb``), and after parsing, an upper bound of the memory its prepared videos take
(``prepared_bytes``). It is answered 503 (``overloaded``, ``Retry-After``) when that does not fit in
``--max-inflight-mb``, and 413 when it could never fit. Everything is released when it is answered,
except that a request answered 504 while a worker still prepares its frames keeps its body and frame
bytes counted until that worker is done (``ByteBudget.hold_until_done``).

For a file or encoded bytes, the frame count comes from the duration the container declares, plus
the slack decoding allows (``decode.declared_bound``): a context with frames past it is refused as
soon as the decoder reaches one, so a header that understates its video cannot pass the bound. So the
service's resident memory stays within (README, "Limits"):

    idle process + max_inflight_mb + context_cache_mb + context_store_mb + prefix_cache_mb (CPU device)
    + one decoded full-size source frame per preprocessing worker + the forward pass's activations

A lock-protected counter and the estimates; the only I/O is reading a file context's header
(``declared_duration``), in the request's parse thread.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future
from typing import Any, Sequence

from ...clip import Clip
from ...contract import Contract
from ...video.inputs import Sampled
from ...limits import Limits


class ByteBudget:
    """Bytes reserved by requests in flight, at most ``max_bytes``."""

    def __init__(self, max_bytes: int, on_release=None):
        self.max_bytes = max_bytes
        self._used = 0
        self._lock = threading.Lock()
        self._on_release = on_release or (lambda: None)

    @property
    def used(self) -> int:
        return self._used

    def try_reserve(self, n: int) -> bool:
        with self._lock:
            if self._used + n > self.max_bytes:
                return False
            self._used += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self._used = max(0, self._used - n)
        self._on_release()

    def hold_until_done(self, n: int, pending: "Sequence[Future]") -> None:
        """Count ``n`` more bytes (past the limit if need be) until every future in ``pending`` is done.

        For work that outlives its request: a request answered 504 gives its reservation back with the
        answer, while a worker may still be preparing its frames from its body; those stay counted until
        the scheduler lets go of them (``Admitted.settled``). The callbacks reach neither the futures nor
        what they prepare, so nothing is kept alive by them."""
        left = [f for f in pending if not f.done()]
        if not left or n <= 0:
            return
        with self._lock:
            self._used += n
        count = [len(left)]
        lock = threading.Lock()

        def one(_: Future) -> None:
            with lock:
                count[0] -= 1
                last = count[0] == 0
            if last:
                self.release(n)

        for f in left:
            f.add_done_callback(one)


def frame_bytes(contract: Contract, codec: bool) -> int:
    """Most bytes one prepared frame holds: its contract image (RGB at most ``max_pixels``) and its
    patches (uint8 with the fast codec; the processor's float32 values, two temporal copies, without)."""
    return contract.max_pixels * 3 * (1 + (1 if codec else 8))


def sampled_frames(value: Any, role: str, contract: Contract, limits: Limits) -> int:
    """Most frames the contract samples from ``value`` (a parsed request input)."""
    if role == "candidate":
        return contract.candidate_frames
    cap = limits.max_context_samples
    if contract.max_context_frames:
        cap = min(cap, contract.max_context_frames)
    if value is None:
        return 0
    if isinstance(value, Sampled):
        return min(len(value.frames), cap)
    if isinstance(value, Clip):
        return min(len(value), math.ceil(len(value) / value.fps * contract.sample_fps) + 1, cap)
    from ...video.decode import declared_bound, declared_duration

    seconds = declared_duration(value)  # a file or encoded bytes: the header's word, else the cap
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return cap
    # decoding refuses a context with a frame past declared_bound, so no more than this is ever sampled
    return min(cap, math.ceil(declared_bound(seconds) * contract.sample_fps) + 1)


def prepared_bytes(videos: list[tuple[Any, str, str]], contract: Contract, limits: Limits, codec: bool) -> int:
    """An upper bound of the memory the prepared forms of ``videos`` [(value, role, key)] take; inputs
    with one content key (a context shared by a request's items) are prepared once and counted once."""
    per = frame_bytes(contract, codec)
    seen: set[str] = set()
    total = 0
    for value, role, key in videos:
        if key:
            if key in seen:
                continue
            seen.add(key)
        total += sampled_frames(value, role, contract, limits) * per
    return total
