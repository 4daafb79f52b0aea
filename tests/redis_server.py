"""A real Debian ``redis-server`` for one test: its own free loopback port and temporary folder, no persistence.

    with RedisServer(tmp_path) as r:        # or the ``redis_url`` fixture of a test module
        ServeConfig(job_store=r.url)
        r.stop(); r.start()                 # Redis lost and back (same port, empty: persistence is off)

Tests that need it skip with the reason when ``redis-server`` or redis-py is not installed (``make test`` installs both).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import free_port


def require_redis() -> str:
    """The ``redis-server`` binary, or a skip naming what is missing."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; make test installs it)")
    pytest.importorskip("redis", reason="redis-py is not installed (pip install 'nvrm[redis]')")
    return binary


class RedisServer:
    """``redis-server --port P --bind 127.0.0.1 --dir TMP --save '' --appendonly no``, ready when started."""

    def __init__(self, folder: Path, *extra: str):
        self.binary = require_redis()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.extra = extra
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        """Start it (again, on the same port) and wait until it answers PING."""
        import redis

        self.log = open(self.folder / f"redis-{self.port}.log", "a")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "", "--appendonly", "no",
             *self.extra],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            assert self.proc.poll() is None, (self.folder / f"redis-{self.port}.log").read_text()[-2000:]
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError(f"redis-server on port {self.port} did not answer PING within 20 s")

    def client(self):
        """A redis-py client of it."""
        import redis

        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        """Stop it (its data is gone: nothing is persisted)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.log.close()

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
