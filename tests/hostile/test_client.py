"""A hostile or broken server against ``RewardClient``: the call ends within its timeout and its size
cap, with a ``ServiceError``, never a hang, a huge allocation or a raw parser error."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from nvrm.client import RewardClient
from nvrm.errors import ServiceError


class RawServer:
    """Answers every connection with ``head`` and then ``chunks`` (each after ``gap`` seconds)."""

    def __init__(self, head: bytes, chunks, gap: float = 0.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.head, self.chunks, self.gap = head, chunks, gap
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        try:
            conn.recv(65536)
            conn.sendall(self.head)
            for chunk in self.chunks():
                if self.stop.is_set():
                    break
                time.sleep(self.gap)
                conn.sendall(chunk)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


def trickle():
    for _ in range(1000):
        yield b"{"


def test_a_trickled_answer_ends_at_the_timeout_in_all():
    server = RawServer(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n", trickle, gap=0.3)
    try:
        client = RewardClient(server.url, timeout=1.5, retries=0)
        t0 = time.monotonic()
        with pytest.raises(ServiceError, match="longer than timeout=1.5 s in all"):
            client.info()
        assert time.monotonic() - t0 < 4  # one read of 0.3 s past the deadline at most, not 1000 of them
        t0 = time.monotonic()
        with pytest.raises(ServiceError, match="longer than timeout"):
            asyncio.run(RewardClient(server.url, timeout=1.5, retries=0).ascore_batch([("p", b"v", b"v")]))
        assert time.monotonic() - t0 < 4
    finally:
        server.close()


def test_a_huge_answer_is_not_read_into_memory():
    def endless():
        for _ in range(10_000):
            yield b"x" * 65536  # 640 MB if it were all read

    server = RawServer(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n", endless)
    try:
        with pytest.raises(ServiceError, match="larger than max_response_bytes=1048576"):
            RewardClient(server.url, retries=0, max_response_bytes=1 << 20).info()
    finally:
        server.close()


def test_an_html_page_is_a_service_error():
    page = b"<html><body>proxy error</body></html>"
    server = RawServer(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n" % len(page), lambda: iter([page]))
    try:
        with pytest.raises(ServiceError, match="text/html, not JSON"):
            RewardClient(server.url, retries=0).info()
    finally:
        server.close()


def test_a_published_contract_beyond_sane_limits_is_refused_in_one_line():
    """Issue 33, item 4: a server publishing sample_fps = 1e6 with a matching fingerprint made the client
    allocate 14 GiB for a 40-frame clip; it is refused before anything is sampled."""
    import json

    import numpy as np

    from nvrm.clip import Clip
    from nvrm.contract import Contract

    c = Contract(sample_fps=1e6)
    info = json.dumps({"contract": {"fields": c.to_dict(), "contract_fields_fingerprint": c.fingerprint, "fingerprint": "x", "sampling": {}}}).encode()
    server = RawServer(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(info), lambda: iter([info]))
    try:
        clip = Clip(np.zeros((40, 64, 64, 3), np.uint8), 8.0)
        for call in (lambda c: c.upload_context(clip), lambda c: c.score("p", clip, clip)):
            with pytest.raises(ServiceError) as e:  # a client of its own each: the raw server answers one request per connection
                call(RewardClient(server.url, timeout=60, retries=0))
            assert "publishes a contract beyond sane limits (sample_fps=1000000.0 > 60)" in str(e.value) and "\n" not in str(e.value)
    finally:
        server.close()


def test_upload_context_with_a_wrong_key_says_401(model):
    """Issue 33, item 13: a wrong API key was reported as "this server publishes no contract"."""
    import numpy as np

    from helpers import InProcessServer
    from nvrm.clip import Clip

    server = InProcessServer(model, api_key="right")
    try:
        client = server.client(api_key="wrong")
        with pytest.raises(ServiceError) as e:
            client.upload_context(Clip(np.zeros((16, 64, 64, 3), np.uint8), 8.0))
        assert e.value.status == 401 and "publishes no contract" not in str(e.value)
        assert server.client(api_key="right").upload_context(Clip(np.zeros((16, 64, 64, 3), np.uint8), 8.0))
    finally:
        server.stop()
