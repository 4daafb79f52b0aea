"""The service's scheduler in process: shared contexts, deadlines, drain (no HTTP)."""

from __future__ import annotations

import time

import pytest

from helpers import GROUP_ULPS, bf16_ulp
from nvrm import Clip
from nvrm.serve.batching.contexts import ContextCache, PrefixCache
from nvrm.serve.admission.media import Media
from nvrm.serve.metrics import Metrics
from nvrm.errors import Expired, InputError, ShuttingDown
from nvrm.serve.batching.scheduler import Scheduler
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(8, 64, 80, seed=1), fps=4)
CANDS = [Clip(moving_square(20, 64, 80, seed=10 + i, speed=1 + i), fps=4) for i in range(4)]


@pytest.fixture()
def make(model):
    made = []

    def build(cache_mb: float = 64, wait_ms: float = 300, share_wait_ms: float = 50, prefix_mb: float = 64):
        holder = {}
        metrics = Metrics(lambda: holder["s"].depth, lambda: cache.bytes, lambda: prefixes.bytes)
        cache = ContextCache(int(cache_mb * 2**20), lambda hit: metrics.context_cache.labels(result="hit" if hit else "miss").inc())
        prefixes = PrefixCache(int(prefix_mb * 2**20), lambda hit: metrics.prefix_cache.labels(result="hit" if hit else "miss").inc())
        s = holder["s"] = Scheduler(
            model, max_batch_items=64, max_wait_ms=wait_ms, max_queue_items=64, metrics=metrics, cache=cache,
            share_wait_ms=share_wait_ms, prefixes=prefixes,
        )
        made.append(s)
        return s, metrics

    yield build
    for s in made:
        s.stop(5)


def value(metric) -> float:
    return sum(s.value for m in metric.collect() for s in m.samples if s.name.endswith("_total") or s.name == m.name)


def test_items_of_separate_requests_with_one_context_share_a_group(make, model):
    s, metrics = make()
    ctx = Media(CTX, "frames:ctx")
    assert s.try_admit(4)
    futures = [s.submit("p", ctx, Media(c, f"c{i}"), deadline=time.monotonic() + 60) for i, c in enumerate(CANDS)]
    got = [f.result(60).reward for f in futures]
    want = [model.score("p", CTX, c).reward for c in CANDS]
    assert all(abs(g - w) <= GROUP_ULPS * bf16_ulp(w) for g, w in zip(got, want))
    assert value(metrics.shared) >= 2 and value(metrics.context_cache) == 4  # 1 miss + 3 hits


def test_the_scorer_waits_for_items_of_a_context_still_being_prepared(make, model):
    """No batching wait at all, but a share wait: every item of the context joins one group."""
    s, metrics = make(wait_ms=0, share_wait_ms=5000)
    ctx = Media(CTX, "frames:ctx")
    assert s.try_admit(4)
    futures = [s.submit("p", ctx, Media(c, f"c{i}"), deadline=time.monotonic() + 60) for i, c in enumerate(CANDS)]
    assert all(f.result(60).reward is not None for f in futures)
    assert value(metrics.shared) == 4


@pytest.mark.parametrize("prefix_mb", [64, 0])
def test_items_of_one_context_in_later_batches_reuse_its_prefill(make, model, monkeypatch, prefix_mb):
    """One request at a time (each its own batch): the context is prefilled once, then only suffixes run."""
    import nvrm.forward.runtime

    prefills = []
    real = nvrm.forward.runtime.prefill
    monkeypatch.setattr(nvrm.forward.runtime, "prefill", lambda *a, **k: prefills.append(1) or real(*a, **k))
    s, metrics = make(wait_ms=0, share_wait_ms=0, prefix_mb=prefix_mb)
    ctx = Media(CTX, "frames:ctx")
    got = []
    for i, c in enumerate(CANDS):
        assert s.try_admit(1)
        got.append(s.submit("p", ctx, Media(c, f"c{i}"), deadline=time.monotonic() + 60).result(60).reward)
    want = [model.score("p", CTX, c).reward for c in CANDS]
    assert all(abs(g - w) <= GROUP_ULPS * bf16_ulp(w) for g, w in zip(got, want)), (got, want)
    if prefix_mb:
        hits = sum(x.value for m in metrics.prefix_cache.collect() for x in m.samples if x.name.endswith("_total") and x.labels["result"] == "hit")
        assert len(prefills) == 1 and value(metrics.prefix_cache) == 4 and hits == 3 and value(metrics.shared) == 3
        assert 0 < s.prefixes.bytes <= prefix_mb * 2**20
    else:
        assert len(prefills) == 4 and s.prefixes.bytes == 0  # off: every item prefills its context again


def test_without_the_cache_nothing_is_shared(make, model):
    s, metrics = make(cache_mb=0)
    ctx = Media(CTX, "frames:ctx")
    assert s.try_admit(2)
    futures = [s.submit("p", ctx, Media(c, f"c{i}"), deadline=time.monotonic() + 60) for i, c in enumerate(CANDS[:2])]
    assert all(f.result(60).reward for f in futures)
    assert value(metrics.shared) == 0


def test_expired_items_are_dropped_before_their_forward(make, model, monkeypatch):
    s, metrics = make()
    calls = []
    real = model.score_prepared
    monkeypatch.setattr(model, "score_prepared", lambda items, **k: calls.append(len(items)) or real(items, **k))
    assert s.try_admit(1)
    fut = s.submit("p", Media(CTX, "frames:x"), Media(CANDS[0], "c"), deadline=time.monotonic() - 1)
    assert isinstance(fut.result(60), Expired) and calls == [] and value(metrics.expired) == 1


def test_the_drain_deadline_answers_what_is_still_open(make, model, monkeypatch):
    import threading

    s, _ = make(wait_ms=0)
    on_model, release = threading.Event(), threading.Event()
    real = model.score_prepared_group

    def stuck(*args, **kwargs):  # a forward that outlives the drain deadline
        on_model.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "score_prepared_group", stuck)
    assert s.try_admit(3)
    fut = s.submit_group("p", Media(CTX, "frames:y"), [Media(c, f"c{i}") for i, c in enumerate(CANDS[:3])], deadline=time.monotonic() + 60)
    assert on_model.wait(60)
    s.begin_drain(0)
    out = fut.result(30)
    release.set()
    assert len(out) == 3 and all(isinstance(r, ShuttingDown) for r in out)  # a group's answer keeps its shape
    assert all(not isinstance(r, InputError) for r in out)  # the server's state, not the input's fault
    assert s.try_admit(1)  # requests already in flight may still be admitted while draining


def test_a_failed_shared_forward_answers_its_items_and_gives_back_the_kept_prefixes(make, model, monkeypatch):
    from nvrm.errors import NvrmError

    s, _ = make(wait_ms=0, share_wait_ms=0)
    ctx = Media(CTX, "frames:ctx")
    assert s.try_admit(1)
    assert s.submit("p", ctx, Media(CANDS[0], "c0"), deadline=time.monotonic() + 60).result(60).reward is not None
    assert s.prefixes.bytes > 0  # the lone item left its prefill behind
    real = model.score_prepared_group_reusing
    monkeypatch.setattr(model, "score_prepared_group_reusing", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device fault")))
    assert s.try_admit(1)
    failed = s.submit("p", ctx, Media(CANDS[1], "c1"), deadline=time.monotonic() + 60).result(60)
    assert isinstance(failed, NvrmError) and "device fault" in str(failed) and s.prefixes.bytes == 0
    monkeypatch.setattr(model, "score_prepared_group_reusing", real)
    assert s.try_admit(1)
    assert s.submit("p", ctx, Media(CANDS[1], "c1"), deadline=time.monotonic() + 60).result(60).reward is not None
