"""The CPU service's latent decodes, in processes of their own (``--decode-workers``).

A Wan VAE decode is thousands of small operations. On the CPU, two intra-op threads decode a group no faster than one
(the tiny VAE, 8 rollouts: 7.0 s against 6.9 s on 2 cores), while two decodes side by side, one thread each, take the
time of one. So the service decodes on one thread per VAE call (``LatentDecoder``'s CPU rule, which also makes the
frames the same on a machine of any core count) and runs several calls at once, one per worker process:

- a process of its own per decode, so the VAE never waits for the server's GIL (its event loop answers every poll) and
  keeps glibc's default allocator (the server's ``memory.tune`` maps every buffer of 8 MiB or more, and the VAE's
  activations are such buffers);
- ``DecodeQueue`` hands each worker a share of the queued rollouts of one group, so a group of 8 decodes as 4 + 4 on
  two workers, and each rollout's frames are those of ``LatentDecoder.decode`` in process, bit for bit (rows do not
  depend on their batch, ``tests/integration/test_latent_batching.py``).

The worker is ``python -m nvrm.serve.protocols.cosmos.decode_workers FOLDER``, started by the server. The two talk over the worker's
stdin and stdout: each message a length and its bytes, the headers JSON, the latents and frames raw arrays (nothing is
pickled). A worker that dies during a batch is started again and given the batch once more; one that dies on it twice
fails only that batch, whose requests ``DecodeQueue`` then decodes one by one, so a rollout that kills the worker
takes no other rollout with it.

A worker that hangs (stopped with SIGSTOP, stuck) is a death too: while it loads its VAE and while it decodes, it
sends a heartbeat every ``HEARTBEAT_S``, and a watchdog kills a worker the server has heard nothing from for
``--decode-timeout-s`` (while it loads: at least ``START_SILENCE_S``), which ends the blocked read or write of its
batch. So every wait on a worker has a bound, and ``close`` never waits on a batch: a worker that is mid-batch or does
not exit within its grace is killed (issue 54).
"""

from __future__ import annotations

import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO, Callable

import numpy as np

from ....errors import ConfigError, InputError, InternalError, WorkerLost

log = logging.getLogger(__name__)

MAX_WORKERS = 4
"""The most worker processes ``auto`` starts (each holds its own copy of the VAE)."""
HEARTBEAT_S = 0.5
"""How often a worker says it is alive while it loads its VAE or decodes (``{"alive": true}`` between messages)."""
SILENCE_S = 30.0
"""How long a worker may send nothing before it is taken for hung (``--decode-timeout-s``'s default)."""
START_SILENCE_S = 120.0
"""The least silence allowed while a worker starts: importing torch loads its libraries with the GIL held."""
_CHUNK = 1 << 20
_LEN = struct.Struct("<Q")
_ALIVE = {"alive": True}


def auto_workers(threads: int) -> int:
    """Workers for a CPU server whose torch uses ``threads`` intra-op threads: one per thread, at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, threads))


def _nothing() -> None:
    pass


def _send(out: BinaryIO, payload: bytes | memoryview, heard: Callable[[], None] = _nothing) -> None:
    """One message: its length, then its bytes, in chunks (``heard`` after each: the reader is taking them)."""
    out.write(_LEN.pack(len(payload)))
    view = memoryview(payload).cast("B")
    for at in range(0, len(view), _CHUNK):
        out.write(view[at : at + _CHUNK])
        heard()


def _send_json(out: BinaryIO, obj: Any) -> None:
    _send(out, json.dumps(obj).encode())
    out.flush()


def _read_exact(inp: BinaryIO, n: int, into: memoryview | None = None, heard: Callable[[], None] = _nothing) -> memoryview:
    buf = memoryview(bytearray(n)) if into is None else into
    got = 0
    while got < n:
        k = inp.readinto(buf[got:])
        if not k:
            raise EOFError(f"the pipe closed after {got} of {n} bytes")
        got += k
        heard()
    return buf


def _recv(inp: BinaryIO, into: memoryview | None = None, heard: Callable[[], None] = _nothing) -> memoryview:
    (n,) = _LEN.unpack(_read_exact(inp, _LEN.size, heard=heard))
    if into is not None and len(into) != n:
        raise EOFError(f"a message of {n} bytes where {len(into)} were expected")
    return _read_exact(inp, n, into, heard)


def _recv_json(inp: BinaryIO, heard: Callable[[], None] = _nothing) -> Any:
    """The next JSON message, past any heartbeats."""
    while True:
        msg = json.loads(bytes(_recv(inp, heard=heard)))
        if msg != _ALIVE:
            return msg


class _Heartbeat:
    """In the worker: ``{"alive": true}`` every ``HEARTBEAT_S`` on ``out`` while the block runs (loading, decoding). The
    block's own messages are written after it, so a heartbeat never lands inside one."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="nvrm-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                _send_json(self.out, _ALIVE)
            except OSError:  # the server is gone: the main thread finds out on its next read
                return

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


class _Watchdog:
    """In the server: kills ``proc`` once nothing has come from it for ``silence_s`` (a hung or stopped worker), which
    ends the read or write of the thread waiting on it. Bytes waiting unread in its pipe count as a sign of life (the
    reading thread may only be slow to take them)."""

    def __init__(self, proc: subprocess.Popen, silence_s: float):
        self.proc, self.silence_s = proc, silence_s
        self.fired = False
        self._last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="nvrm-decode-watchdog", daemon=True)

    def heard(self) -> None:
        """Something came from the worker (or it took what was sent)."""
        self._last = time.monotonic()

    def _pending(self) -> bool:
        try:
            return bool(select.select([self.proc.stdout], [], [], 0)[0])
        except (OSError, ValueError):  # closed meanwhile
            return False

    def _watch(self) -> None:
        tick = min(1.0, self.silence_s / 4)
        while not self._done.wait(tick):
            if time.monotonic() - self._last <= self.silence_s or self._pending():
                continue
            self.fired = True
            try:
                self.proc.kill()  # SIGKILL ends a stopped process too
            except OSError:
                pass
            return

    def __enter__(self) -> "_Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()


class DecodeWorker:
    """One worker process holding the VAE at ``path``; ``decode_batch`` as ``LatentDecoder.decode_batch``. A worker that
    sends nothing for ``silence_s`` while it decodes (``START_SILENCE_S`` at least while it starts) is killed."""

    def __init__(self, path: str, name: str = "decode-0", silence_s: float = SILENCE_S):
        self.path, self.name, self.silence_s = path, name, silence_s
        self.starts = 0
        """Processes started (a restart after a death counts)."""
        self.hung = 0
        """Processes killed for going silent (hung or stopped)."""
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Start the process; ``ready`` waits for its answer."""
        cmd = [sys.executable, "-m", "nvrm.serve.protocols.cosmos.decode_workers", self.path]
        # a session of its own: a Ctrl-C to the server's terminal reaches the server, which drains and closes the
        # worker, not the worker mid-batch; the worker also exits when the server's end of its stdin closes
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
        self.starts += 1

    def ready(self) -> dict:
        """The worker's hello once its VAE is loaded; a ``ConfigError`` naming the folder when it could not load it, or
        when it went silent (hung) while loading."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        silence = max(self.silence_s, START_SILENCE_S)
        try:
            with _Watchdog(proc, silence) as dog:
                hello = _recv_json(proc.stdout, dog.heard)
        except (EOFError, OSError, ValueError) as e:
            code = proc.poll()
            self._kill()
            why = f"it sent nothing for {silence:.0f} s (hung or stopped) and was killed" if dog.fired else f"exit {code}; {e}"
            raise ConfigError(f"--latent-decoder {self.path}: the decode worker exited before it was ready ({why})") from e
        if "error" in hello:
            self._kill()
            raise ConfigError(hello["error"])
        return hello

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def decode_batch(self, requests: list[tuple[np.ndarray, float, dict[int, str]]]) -> list[tuple[np.ndarray, float]]:
        """What ``LatentDecoder.decode_batch`` answers for ``requests``, decoded by the worker; each request's
        ``refused`` gains the rollouts the worker refused. A dead worker is started again first, and a worker that dies
        or hangs during the batch is started again and given it once more (it may have been killed for another reason);
        a second death is a ``WorkerLost`` (an ``InternalError``), as is a worker closed meanwhile."""
        try:
            return self._once(requests)
        except WorkerLost as e:
            if self._closed:
                raise
            log.warning("%s; starting it again for the same batch", e)
        try:
            return self._once(requests)
        except WorkerLost as e:
            if self._closed:
                raise
            raise WorkerLost(f"{e}, twice on this batch: it is not decoded") from None

    def _once(self, requests: list[tuple[np.ndarray, float, dict[int, str]]]) -> list[tuple[np.ndarray, float]]:
        with self._lock:
            if self._closed:
                raise WorkerLost(f"the latent decode worker {self.name} was closed (the server is stopping)")
            if self._proc is None or self._proc.poll() is not None:
                self.start()
                try:
                    self.ready()
                except ConfigError as e:
                    raise WorkerLost(f"the latent decode worker {self.name} could not be started again: {e}") from None
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            dog = _Watchdog(proc, self.silence_s)
            try:
                with dog:
                    return self._exchange(proc, requests, dog.heard)
            except (EOFError, OSError, ValueError) as e:
                self._kill()
                if dog.fired:
                    self.hung += 1
                    raise WorkerLost(f"the latent decode worker {self.name} sent nothing for {self.silence_s:g} s "
                                     "(hung or stopped; --decode-timeout-s) and was killed") from e
                if self._closed:
                    raise WorkerLost(f"the latent decode worker {self.name} was closed (the server is stopping)") from e
                raise WorkerLost(f"the latent decode worker {self.name} stopped (exit {proc.poll()}: {e})") from e

    @staticmethod
    def _exchange(proc: subprocess.Popen, requests: list[tuple[np.ndarray, float, dict[int, str]]],
                  heard: Callable[[], None]) -> list[tuple[np.ndarray, float]]:
        """Send ``requests`` to the worker and read its answer (``heard`` on every sign of life)."""
        assert proc.stdin is not None and proc.stdout is not None
        head = [{"shape": list(z.shape), "dtype": str(z.dtype), "sigma_data": float(s), "refused": {str(i): r for i, r in given.items()}}
                for z, s, given in requests]
        _send_json(proc.stdin, {"requests": head})
        for z, _, _ in requests:
            _send(proc.stdin, memoryview(np.ascontiguousarray(z)).cast("B"), heard)
        proc.stdin.flush()
        reply = _recv_json(proc.stdout, heard)
        if "error" in reply:
            if "source" in reply:
                raise InputError(reply["source"], reply["error"])
            raise InternalError(f"latent decode: {reply['error']}")
        out = []
        for (_, _, given), r in zip(requests, reply["results"]):
            frames = np.empty(r["shape"], dtype=np.uint8)
            _recv(proc.stdout, memoryview(frames).cast("B"), heard)
            given.update({int(i): why for i, why in r["refused"].items()})
            out.append((frames, float(r["seconds"])))
        return out

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the process: it exits once its stdin closes, or is killed after ``wait_s``; a worker mid-batch (which a
        hung worker always is) is killed at once, and the batch's thread does not start it again. Never waits on a
        batch."""
        self._closed = True
        if not self._lock.acquire(timeout=0.5):
            proc = self._proc
            if proc is not None:
                proc.kill()
                proc.wait()
            return
        try:
            proc, self._proc = self._proc, None
        finally:
            self._lock.release()
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=wait_s)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def start_workers(path: str, n: int, silence_s: float = SILENCE_S) -> list[DecodeWorker]:
    """``n`` workers for the VAE at ``path``, started side by side and ready (a ``ConfigError`` if one cannot load it);
    each is taken for hung after ``silence_s`` without a word (``--decode-timeout-s``)."""
    workers = [DecodeWorker(path, f"decode-{i}", silence_s) for i in range(n)]
    for w in workers:
        w.start()
    try:
        for w in workers:
            w.ready()
    except BaseException:
        for w in workers:
            w.close()
        raise
    return workers


def main(argv: list[str] | None = None) -> int:
    """The worker: load the VAE on the CPU with one thread, then decode what arrives on stdin until it closes."""
    path = (sys.argv[1:] if argv is None else argv)[0]
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the replies
    try:
        with _Heartbeat(out):  # the server takes a worker silent for long for hung
            import torch

            from .latents import LatentDecoder

            torch.set_num_threads(1)
            dec = LatentDecoder(path, "cpu")
    except Exception as e:  # noqa: BLE001 - one line back to the server, which exits 2 with it
        _send_json(out, {"error": str(e) if isinstance(e, ConfigError) else f"--latent-decoder {path}: {type(e).__name__}: {e}"})
        return 2
    _send_json(out, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            head = _recv_json(inp)
            requests = []
            for r in head["requests"]:
                z = np.frombuffer(_recv(inp), dtype=np.dtype(r["dtype"])).reshape(r["shape"])
                requests.append((z, r["sigma_data"], {int(i): why for i, why in r["refused"].items()}))
        except EOFError:
            return 0
        try:
            with _Heartbeat(out):
                done = dec.decode_batch(requests)
        except Exception as e:  # noqa: BLE001 - answered; the server decides what it costs
            _send_json(out, {"error": e.reason, "source": e.source} if isinstance(e, InputError) else {"error": f"{type(e).__name__}: {e}"})
            continue
        _send_json(out, {"results": [{"shape": list(f.shape), "seconds": s, "refused": {str(i): why for i, why in given.items()}}
                                     for (f, s), (_, _, given) in zip(done, requests)]})
        for f, _ in done:
            _send(out, memoryview(np.ascontiguousarray(f)).cast("B"))
        del done, requests


if __name__ == "__main__":
    sys.exit(main())
