"""Distinct presampled contexts over multipart (the client's own path), under small budgets: the resident
peak stays within the stated bound, and once the load is answered the idle server gives the memory back
to within its caches (README, "The service's memory model")."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from helpers import Server, memory_mib
from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.errors import RemoteItemError, ServiceError
from nvrm.synth.clips import moving_square

pytestmark = pytest.mark.exclusive  # a server near its memory bound: no other such module beside it

BUDGETS_MB = {"--max-inflight-mb": 256, "--context-cache-mb": 32, "--context-store-mb": 32, "--prefix-cache-mb": 16}
FRAMES = 96  # 96 s at 1 fps; 144x256 sources: a 10.6 MB body, 44 MB of prepared frames each
FORWARD_MB = FRAMES * 76800 * 24 // 2**20
MARGIN_MB = 256  # the tiny model's activations, two workers' frames, allocator slack
CAND = Clip(moving_square(5, 64, 96, seed=2), fps=1)


def test_distinct_contexts_stay_within_the_bound_and_memory_comes_back(tiny_bundle):
    flags = [x for kv in BUDGETS_MB.items() for x in kv] + ["--workers", 2, "--request-timeout-s", 300]
    s = Server(tiny_bundle, *flags)
    try:
        client = RewardClient(s.url, retries=40, backoff=0.05)
        client.score("p", Clip(moving_square(3, 64, 96, seed=1), fps=1), CAND)
        idle = memory_mib(s.proc.pid)["VmRSS"]
        contexts = [Clip(moving_square(FRAMES, 144, 256, seed=500 + k), fps=1) for k in range(10)]

        def one(ctx):
            try:
                r = RewardClient(s.url, retries=40, backoff=0.05).score_group("p", ctx, [CAND], errors="return")[0]
            except ServiceError as e:
                assert e.status in (413, 503), e
                return
            assert not (isinstance(r, RemoteItemError) and r.code == "internal"), r

        with ThreadPoolExecutor(10) as pool:
            list(pool.map(one, contexts))
        peak = memory_mib(s.proc.pid)["VmHWM"] - idle
        bound = sum(BUDGETS_MB.values()) + FORWARD_MB
        assert peak <= bound + MARGIN_MB, (peak, bound)
        time.sleep(3)  # idle: what is left is the caches' and the store's
        kept = memory_mib(s.proc.pid)["VmRSS"] - idle
        caches = BUDGETS_MB["--context-cache-mb"] + BUDGETS_MB["--context-store-mb"] + BUDGETS_MB["--prefix-cache-mb"]
        assert kept <= caches + MARGIN_MB, (kept, caches, peak)
        assert np.isfinite(client.score_group("p", contexts[0], [CAND])[0].reward)
    finally:
        s.stop()
