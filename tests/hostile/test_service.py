"""Hostile requests against ``nvrm serve`` running under an address-space cap.

Each input is generated here at test time. The server runs in a subprocess under RLIMIT_AS (its idle
virtual size is about 4 GB, mostly reserved address space; the cap leaves a margin for real work and
nothing for a request that builds gigabytes). Every case ends in a 4xx, a per-item error that is not
``internal``, or a correct reward, and the server keeps answering ordinary requests afterwards.
"""

from __future__ import annotations

import io
import os
import threading
import time

import httpx
import numpy as np
import pytest

from helpers import Server
from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.protocol import npy_bytes
from nvrm.synth.clips import moving_square, write_video

CAP_GB = 6.0
CTX = Clip(moving_square(3, 64, 96, seed=1), fps=1)
CAND = Clip(moving_square(5, 64, 96, seed=2), fps=1)


@pytest.fixture(scope="module")
def jail(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    inside, outside = root / "allowed", root / "outside"
    inside.mkdir()
    outside.mkdir()
    write_video(inside / "ok.mp4", moving_square(48, 64, 96, seed=1), 8)
    write_video(outside / "secret.mp4", moving_square(48, 64, 96, seed=3), 8)
    seg = outside / "secret.mp4"
    # an HLS playlist and a concat list inside the jail that name a file outside it
    (inside / "evil.m3u8").write_text(f"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:6\n#EXTINF:6.0,\n{seg}\n#EXT-X-ENDLIST\n")
    (inside / "evil_m3u8.mp4").write_text((inside / "evil.m3u8").read_text())
    (inside / "cat.ffconcat").write_text(f"ffconcat version 1.0\nfile {seg}\n")
    os.mkfifo(inside / "fifo.mp4")
    return inside


@pytest.fixture(scope="module")
def server(tiny_bundle, jail):
    s = Server(tiny_bundle, "--allow-dir", str(jail), "--request-timeout-s", "60", address_space_gb=CAP_GB)
    yield s
    s.stop()


def alive(server) -> None:
    """The server still scores an ordinary request, and is still the same process."""
    assert server.proc.poll() is None, server.output()
    r = RewardClient(server.url, retries=0).score("p", CTX, CAND)
    assert np.isfinite(r.reward)


@pytest.mark.parametrize("element", [b"0", b'"ab"'])
def test_a_flat_json_list_is_refused_before_it_costs_memory(server, element):
    head = b'{"prompt": "p", "context": {"path": "x"}, "candidates": ['
    body = head + b",".join([element] * (12_000_000 if element == b"0" else 6_000_000)) + b"]}"  # ~24-36 MB, no braces
    r = httpx.post(server.url + "/v1/score_group", content=body, headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text[:300]
    assert "JSON values" in r.json()["error"]["message"]
    alive(server)


def test_a_long_list_under_the_value_bound_is_counted_before_validation(server):
    body = b'{"prompt": "p", "context": {"path": "x"}, "candidates": [' + b",".join([b"0"] * 300) + b"]}"
    r = httpx.post(server.url + "/v1/score_group", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "has 300 items" in r.json()["error"]["message"]


def test_prompts_may_hold_commas_and_braces(server):
    prompt = "{}," * 1100  # more braces than the structure guard allows outside strings, inside one
    r = RewardClient(server.url, retries=0).score(prompt, CTX, CAND)
    assert np.isfinite(r.reward)


@pytest.mark.parametrize("name", ["evil.m3u8", "evil_m3u8.mp4", "cat.ffconcat"])
@pytest.mark.parametrize("slot", ["context", "candidate"])
def test_a_playlist_in_the_jail_never_reads_outside_it(server, jail, name, slot):
    other = {"path": str(jail / "ok.mp4")}
    item = {"prompt": "p", "context": other, "candidate": other, slot: {"path": str(jail / name)}}
    r = httpx.post(server.url + "/v1/score", json={"items": [item]})
    assert r.status_code in (200, 422), r.text  # 422: every item of the request failed
    result = r.json()["results"][0]
    assert "reward" not in result and result["error"]["code"] == "invalid_input", result


def test_a_fifo_in_the_jail_fails_its_item_and_stalls_nothing(server, jail):
    done: list = []

    def hostile():
        body = {"items": [{"prompt": "p", "context": {"path": str(jail / "fifo.mp4")}, "candidate": {"path": str(jail / "ok.mp4")}}]}
        done.append(httpx.post(server.url + "/v1/score", json=body, timeout=30))

    threads = [threading.Thread(target=hostile) for _ in range(4)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    alive(server)  # an ordinary request is answered meanwhile
    for t in threads:
        t.join(30)
    assert time.monotonic() - t0 < 20 and len(done) == 4
    for r in done:
        assert r.status_code in (200, 400, 422), r.text
        err = r.json()["results"][0]["error"] if r.status_code != 400 else r.json()["error"]
        assert "not a regular file" in err["message"] and err["code"] != "internal"


def test_a_npy_header_with_a_boolean_dimension_is_a_clean_error(server, jail):
    good = npy_bytes(np.zeros((5, 64, 96, 3), np.uint8))
    header_end = good.index(b"\n") + 1
    bad = good[:header_end].replace(b"(5, 64, 96, 3)", b"(True, 64, 96, 3)")
    bad = bad[:8] + len(bad[10:]).to_bytes(2, "little") + bad[10:] + good[header_end:]
    request = '{"prompt": "p", "context": {"path": "%s"}, "candidates": [{"part": "c", "fps": 1.0}]}' % (jail / "ok.mp4")
    files = {"request": (None, request.encode(), "application/json"),
             "c": ("c.npy", io.BytesIO(bad), "application/octet-stream")}
    r = httpx.post(server.url + "/v1/score_group", files=files)
    assert r.status_code in (400, 422), r.text
    assert "must have shape (T, H, W, 3)" in r.text and "internal" not in r.text


def test_slow_bodies_time_out_and_connections_are_capped(tiny_bundle):
    import socket

    s = Server(tiny_bundle, "--body-timeout-s", 2, "--max-connections", 4, address_space_gb=CAP_GB)
    socks = []
    try:
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{")
        t0 = time.monotonic()
        slow.settimeout(10)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += slow.recv(4096)
            slow.sendall(b" ")  # a byte at a time: never the whole body
            time.sleep(0.5)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 6, answer[:200]
        slow.close()
        for _ in range(4):  # hold every allowed connection with a request whose body never ends
            c = socket.create_connection(("127.0.0.1", s.port))
            c.sendall(b"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
            socks.append(c)
        time.sleep(0.3)
        over = httpx.get(s.url + "/healthz")
        assert over.status_code == 503  # refused at once, not queued behind them
        assert over.headers["retry-after"] == "1" and over.json()["error"]["code"] == "overloaded"  # JSON like every error (issue 33, item 12)
        for c in socks:
            c.close()
        socks.clear()
        time.sleep(2.5)
        assert httpx.get(s.url + "/healthz").status_code == 200
        alive(s)
    finally:
        for c in socks:
            c.close()
        s.stop()


def test_an_admitted_body_is_held_once_while_it_is_read():
    """Issue 33, item 11: chunks joined at the end held a body twice at the peak (3.12 GB against ~2.2 GB)."""
    import asyncio
    import tracemalloc

    from nvrm.serve.http.request_bodies import read_body

    size, piece = 64 << 20, 1 << 16

    class Request:
        headers = {"content-length": str(size)}

        async def stream(self):
            chunk = b"x" * piece
            for _ in range(size // piece):
                yield chunk

    async def read():
        tracemalloc.start()
        try:
            body = await read_body(Request(), size, 30.0)
            return body, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    body, peak = asyncio.run(read())
    assert len(body) == size and body[:3] == b"xxx" and body[-1:] == b"x"
    assert peak < 1.2 * size, f"peak {peak / size:.2f} x the body"
