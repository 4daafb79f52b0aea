"""The service's memory model under load, with the server under an address-space cap.

The stated bound (README, "Limits"; ``nvrm.serve.admission.budget``): resident memory stays within the idle
process plus ``--max-inflight-mb``, ``--context-cache-mb``, ``--context-store-mb`` and
``--prefix-cache-mb`` (the model is on the CPU here), plus a decoded frame per worker and the forward
pass's activations (small for the tiny model; the margin below covers them). The load is the one that
took an unbounded server from 0.8 to 12 GB: many small requests with distinct long contexts, a flood of
one-item requests, and large flat JSON bodies. Every answer is a reward, a per-item error that is not
``internal``, or a 4xx/503 that says why.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from helpers import Server, memory_mib
from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.errors import RemoteItemError, ServiceError
from nvrm.synth.clips import moving_square

pytestmark = pytest.mark.exclusive  # a server near its memory bound: no other such module beside it

BUDGETS_MB = {"--max-inflight-mb": 192, "--context-cache-mb": 48, "--context-store-mb": 48, "--prefix-cache-mb": 16}
CONTEXT_FRAMES = 192
FORWARD_MB = CONTEXT_FRAMES * 76800 * 24 // 2**20  # the stated forward term: float32 pixel values of the longest context
MARGIN_MB = 768  # the vision and text activations of the tiny model, two decoding workers' frames, allocator slack
CAND = Clip(moving_square(5, 64, 96, seed=2), fps=1)


def flags() -> list:
    return [x for kv in BUDGETS_MB.items() for x in kv] + ["--workers", 2, "--request-timeout-s", 120]


@pytest.fixture(scope="module")
def idle(tiny_bundle):
    """The idle server's sizes after one request (address space and resident), measured uncapped."""
    s = Server(tiny_bundle, *flags())
    try:
        RewardClient(s.url).score("p", Clip(moving_square(3, 64, 96, seed=1), fps=1), CAND)
        return memory_mib(s.proc.pid)
    finally:
        s.stop()


def outcome(call) -> str:
    try:
        results = call()
    except ServiceError as e:
        assert e.status in (413, 503), e
        return "refused"
    for r in results:
        if isinstance(r, RemoteItemError):
            assert r.code != "internal", r
        else:
            assert np.isfinite(r.reward)
    return "scored"


def test_the_stated_bound_holds_under_load(tiny_bundle, idle):
    bound = sum(BUDGETS_MB.values()) + FORWARD_MB
    s = Server(tiny_bundle, *flags(), address_space_gb=(idle["VmPeak"] + 2 * (bound + MARGIN_MB)) / 1024)
    try:
        client = RewardClient(s.url, retries=20, backoff=0.05)  # a 503 says when to come back; clients do
        long_contexts = [Clip(moving_square(CONTEXT_FRAMES, 32, 32, seed=100 + k), fps=1) for k in range(16)]  # 192 s each, distinct
        small = Clip(moving_square(3, 64, 96, seed=7), fps=1)
        flat = b'{"prompt": "p", "context": {"path": "x"}, "candidates": [' + b",".join([b"0"] * 8_000_000) + b"]}"
        seen = {"scored": 0, "refused": 0}
        lock = threading.Lock()

        def count(kind):
            with lock:
                seen[kind] += 1

        def hostile_flat():
            r = httpx.post(s.url + "/v1/score_group", content=flat, headers={"content-type": "application/json"}, timeout=120)
            assert r.status_code in (413, 503), r.text[:200]

        with ThreadPoolExecutor(16) as pool:
            jobs = [pool.submit(lambda c=c: count(outcome(lambda: client.score_group("p", c, [CAND], errors="return")))) for c in long_contexts]
            jobs += [pool.submit(lambda: count(outcome(lambda: client.score_batch([("p", small, CAND)], errors="return")))) for _ in range(200)]
            jobs += [pool.submit(hostile_flat) for _ in range(3)]
            for j in jobs:
                j.result()
        assert s.proc.poll() is None, s.output()
        assert seen["scored"] >= 100, seen  # the load was served, not just refused
        peak = memory_mib(s.proc.pid)["VmHWM"]
        assert peak - idle["VmRSS"] <= bound + MARGIN_MB, (peak, idle, seen)
        r = client.score_group("p", long_contexts[0], [CAND])  # and a long context still scores once the load is gone
        assert np.isfinite(r[0].reward)
    finally:
        s.stop()
