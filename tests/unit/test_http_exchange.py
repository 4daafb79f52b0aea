"""The one bounded, retried HTTP exchange (``nvrm.remote.exchange``) the client, the judges and the refresh swap share."""

import gzip
import time

import httpx
import pytest

from nvrm.remote.exchange import Backoff, exchange, retry_after


def test_backoff_doubles_with_jitter_to_its_ceiling_and_honours_retry_after_to_30_s():
    b = Backoff(first_s=0.5, most_s=8.0)
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (9, 8.0)]:
        assert all(0.5 * base <= b.wait(attempt) <= 1.5 * base for _ in range(50))
    assert b.wait(3, after=2.5) == 2.5 and b.wait(3, after=3600) == 30.0
    assert retry_after(httpx.Headers({"retry-after": "1.5"})) == 1.5
    assert retry_after(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None and retry_after(None) is None


def served(response: httpx.Response) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(lambda request: response))


def test_a_gzip_bomb_stops_at_the_bound_and_a_declared_huge_body_is_not_read():
    bomb = gzip.compress(b"0" * (8 << 20))
    streamed = httpx.Response(200, headers={"content-encoding": "gzip"}, stream=httpx.ByteStream(bomb))
    got = exchange(served(streamed), "GET", "http://x/", limit=1 << 16, deadline=time.monotonic() + 10)
    assert got.body.too_large and got.body.size == 1 << 16 and not got.unread
    big = httpx.Response(200, headers={"content-length": str(300 << 20)}, stream=httpx.ByteStream(b"{}"))
    got = exchange(served(big), "GET", "http://x/", limit=1 << 20, deadline=time.monotonic() + 10)
    assert got.unread and got.body.too_large and got.declared == 300 << 20 and got.body.size == 0


@pytest.mark.parametrize("response", [httpx.Response(200, json={"a": 1}), httpx.Response(200, stream=httpx.ByteStream(b'{"a": 1}'))])
def test_a_response_built_whole_or_streamed_reads_the_same(response):
    got = exchange(served(response), "GET", "http://x/", limit=1024, deadline=time.monotonic() + 10)
    assert got.status == 200 and got.body.text().replace(" ", "") == '{"a":1}' and not got.body.too_large
