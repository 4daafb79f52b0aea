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

The worker is ``python -m nvrm.serve.decode_workers FOLDER``, started by the server. The two talk over the worker's
stdin and stdout: each message a length and its bytes, the headers JSON, the latents and frames raw arrays (nothing is
pickled). A worker that dies during a batch is started again and given the batch once more; one that dies on it twice
fails only that batch, whose requests ``DecodeQueue`` then decodes one by one, so a rollout that kills the worker
takes no other rollout with it.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import threading
from typing import Any, BinaryIO

import numpy as np

from ..errors import ConfigError, InputError, InternalError, WorkerLost

log = logging.getLogger(__name__)

MAX_WORKERS = 4
"""The most worker processes ``auto`` starts (each holds its own copy of the VAE)."""
_LEN = struct.Struct("<Q")


def auto_workers(threads: int) -> int:
    """Workers for a CPU server whose torch uses ``threads`` intra-op threads: one per thread, at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, threads))


def _send(out: BinaryIO, payload: bytes | memoryview) -> None:
    out.write(_LEN.pack(len(payload)))
    out.write(payload)


def _send_json(out: BinaryIO, obj: Any) -> None:
    _send(out, json.dumps(obj).encode())
    out.flush()


def _read_exact(inp: BinaryIO, n: int, into: memoryview | None = None) -> memoryview:
    buf = memoryview(bytearray(n)) if into is None else into
    got = 0
    while got < n:
        k = inp.readinto(buf[got:])
        if not k:
            raise EOFError(f"the pipe closed after {got} of {n} bytes")
        got += k
    return buf


def _recv(inp: BinaryIO, into: memoryview | None = None) -> memoryview:
    (n,) = _LEN.unpack(_read_exact(inp, _LEN.size))
    if into is not None and len(into) != n:
        raise EOFError(f"a message of {n} bytes where {len(into)} were expected")
    return _read_exact(inp, n, into)


def _recv_json(inp: BinaryIO) -> Any:
    return json.loads(bytes(_recv(inp)))


class DecodeWorker:
    """One worker process holding the VAE at ``path``; ``decode_batch`` as ``LatentDecoder.decode_batch``."""

    def __init__(self, path: str, name: str = "decode-0"):
        self.path, self.name = path, name
        self.starts = 0
        """Processes started (a restart after a death counts)."""
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the process; ``ready`` waits for its answer."""
        cmd = [sys.executable, "-m", "nvrm.serve.decode_workers", self.path]
        # a session of its own: a Ctrl-C to the server's terminal reaches the server, which drains and closes the
        # worker, not the worker mid-batch; the worker also exits when the server's end of its stdin closes
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, start_new_session=True)
        self.starts += 1

    def ready(self) -> dict:
        """The worker's hello once its VAE is loaded; a ``ConfigError`` naming the folder when it could not load it."""
        assert self._proc is not None and self._proc.stdout is not None
        try:
            hello = _recv_json(self._proc.stdout)
        except (EOFError, OSError, ValueError) as e:
            code = self._proc.poll()
            self._kill()
            raise ConfigError(f"--latent-decoder {self.path}: the decode worker exited before it was ready (exit {code}; {e})") from e
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
        during the batch is started again and given it once more (it may have been killed for another reason); a
        second death is a ``WorkerLost`` (an ``InternalError``)."""
        try:
            return self._once(requests)
        except WorkerLost as e:
            log.warning("%s; starting it again for the same batch", e)
        try:
            return self._once(requests)
        except WorkerLost as e:
            raise WorkerLost(f"{e}, twice on this batch: it is not decoded") from None

    def _once(self, requests: list[tuple[np.ndarray, float, dict[int, str]]]) -> list[tuple[np.ndarray, float]]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self.start()
                self.ready()
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            try:
                head = [{"shape": list(z.shape), "dtype": str(z.dtype), "sigma_data": float(s), "refused": {str(i): r for i, r in given.items()}}
                        for z, s, given in requests]
                _send_json(proc.stdin, {"requests": head})
                for z, _, _ in requests:
                    _send(proc.stdin, memoryview(np.ascontiguousarray(z)).cast("B"))
                proc.stdin.flush()
                reply = _recv_json(proc.stdout)
                if "error" in reply:
                    if "source" in reply:
                        raise InputError(reply["source"], reply["error"])
                    raise InternalError(f"latent decode: {reply['error']}")
                out = []
                for (_, _, given), r in zip(requests, reply["results"]):
                    frames = np.empty(r["shape"], dtype=np.uint8)
                    _recv(proc.stdout, memoryview(frames).cast("B"))
                    given.update({int(i): why for i, why in r["refused"].items()})
                    out.append((frames, float(r["seconds"])))
                return out
            except (EOFError, OSError, ValueError) as e:
                self._kill()
                raise WorkerLost(f"the latent decode worker {self.name} stopped (exit {proc.poll()}: {e})") from e

    def close(self) -> None:
        """Stop the process (it exits once its stdin closes)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def start_workers(path: str, n: int) -> list[DecodeWorker]:
    """``n`` workers for the VAE at ``path``, started side by side and ready (a ``ConfigError`` if one cannot load it)."""
    workers = [DecodeWorker(path, f"decode-{i}") for i in range(n)]
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
    import torch

    from .latents import LatentDecoder

    torch.set_num_threads(1)
    try:
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
