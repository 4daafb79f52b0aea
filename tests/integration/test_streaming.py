"""score_groups streams groups in order with bounded look-ahead; exact mode and chunking."""

from __future__ import annotations

import pytest

from nvrm import Clip, Contract, ContractError, InputError, RewardModel
from nvrm.synth.clips import moving_square

CTXS = [Clip(moving_square(12, 64, 80, seed=k), fps=4) for k in range(4)]
CANDS = [Clip(moving_square(24, 64, 80, seed=20 + i, speed=1 + i), fps=4) for i in range(5)]


def groups(n: int):
    return [(f"prompt {k}", CTXS[k % len(CTXS)], CANDS[: 2 + k % 3]) for k in range(n)]


@pytest.mark.slow
def test_score_groups_equals_score_group_in_order(model):
    want = [[r.reward for r in model.score_group(*g)] for g in groups(5)]
    got = [[r.reward for r in out] for out in model.score_groups(groups(5))]
    assert got == want


@pytest.mark.slow
def test_look_ahead_is_bounded(model):
    pulled = []

    def source():
        for k, g in enumerate(groups(6)):
            pulled.append(k)
            yield g

    seen = []
    for k, _ in enumerate(model.score_groups(source(), lookahead=2)):
        seen.append(len(pulled))
        assert len(pulled) <= k + 1 + 2  # group k on the model, at most 2 prepared ahead
    assert seen[0] == 3 and len(seen) == 6


def test_errors_stay_in_their_group_and_slot(model):
    bad = Clip(moving_square(8, 64, 80), fps=4)  # 2 s candidate
    stream = [groups(1)[0], ("p", "/nonexistent.mp4", CANDS[:2]), ("p", CTXS[0], [CANDS[0], bad]), "not a group"]
    out = list(model.score_groups(stream))
    assert [len(o) for o in out] == [2, 2, 2, 1]
    assert all(isinstance(e, InputError) and "file not found" in str(e) for e in out[1])
    assert not isinstance(out[2][0], Exception) and isinstance(out[2][1], ContractError)
    assert isinstance(out[3][0], InputError)
    with pytest.raises(InputError, match="file not found"):
        list(model.score_groups(stream, errors="raise"))


@pytest.mark.slow
def test_exact_mode_is_bit_identical_to_score(model):
    items = [("p", CTXS[0], c) for c in CANDS[:3]] + [("q", CTXS[1], CANDS[3])]
    single = [model.score(*it).reward for it in items]
    assert [r.reward for r in model.score_batch(items, exact=True)] == single
    assert [r.reward for r in model.score_group("p", CTXS[0], CANDS[:3], exact=True)] == single[:3]
    assert [[r.reward for r in o] for o in model.score_groups([("p", CTXS[0], CANDS[:3])], exact=True)] == [single[:3]]


def test_big_groups_are_chunked_with_the_prefix_reused(tiny_bundle, model32):
    chunked = RewardModel.from_pretrained(
        tiny_bundle, device="cpu", dtype="float32", contract=Contract(head_dtype="float32"), group_chunk=2
    )
    try:
        whole = [r.reward for r in model32.score_group("p", CTXS[0], CANDS)]
        calls = []
        import nvrm.forward.runtime as scoring

        real = scoring.prefill
        scoring.prefill = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            parts = [r.reward for r in chunked.score_group("p", CTXS[0], CANDS)]
        finally:
            scoring.prefill = real
        assert len(calls) == 1  # 3 chunks, one prefill
        assert parts == pytest.approx(whole, abs=1e-5)
    finally:
        chunked.close()


def test_group_candidates_over_the_sequence_limit_fail_alone(model, tiny_bundle):
    from nvrm.limits import Limits

    narrow = Clip(moving_square(24, 200, 48, seed=3), fps=4)  # portrait: fewer tokens per frame
    ctx = Clip(moving_square(2, 32, 32), fps=1)
    short, long_ = (r.num_tokens for r in model.score_group("p", ctx, [narrow, CANDS[0]]))
    assert short < long_
    limit = (short + long_) // 2
    m = RewardModel.from_pretrained(tiny_bundle, device="cpu", limits=Limits(max_sequence_tokens=limit))
    try:
        out = m.score_group("p", ctx, [narrow, CANDS[0]], errors="return")
        assert out[0].num_tokens == short
        assert isinstance(out[1], InputError) and f"max_sequence_tokens={limit}" in str(out[1])
        # the engine drops the long row when it encodes the group: the short one's inputs are all that is left
        group = m.engine.prepare_group("p", ctx, [narrow, CANDS[0]])
        assert group.good == [0] and [int(ids.shape[0]) for ids in group.encoded.ids] == [short]
        assert "candidate 1" in str(group.slot_error(1))
    finally:
        m.close()


def test_close_and_context_manager(tiny_bundle):
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", workers=1) as m:
        assert m.score("p", CTXS[0], CANDS[0]).num_tokens > 0
    with pytest.raises(RuntimeError, match="closed"):
        m.score("p", CTXS[0], CANDS[0])
    with pytest.raises(RuntimeError, match="closed"):
        m.score_group("p", CTXS[0], CANDS[:2])  # every path, not just score


@pytest.mark.slow
def test_a_big_group_lets_each_scored_chunk_go(tiny_bundle):
    """Memory flat in the group size: a scored chunk's prepared frames are freed at once (no reference
    cycle through the futures, which only a full garbage collection would break), with gc off."""
    import gc
    import weakref

    clips = [Clip(moving_square(5, 64, 96, seed=40 + i), fps=1) for i in range(16)]
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", group_chunk=4, workers=2) as m:
        from nvrm.scoring import streaming

        seen: list = []
        real = streaming.score_chunk

        def spy(pipe, group, prefix, exact):
            out = real(pipe, group, prefix, exact)
            seen.append([weakref.ref(c) for c in group.candidates])
            return out

        gc.disable()
        try:
            streaming.score_chunk = spy
            rewards = m.score_group("p", CTXS[0], clips)
        finally:
            streaming.score_chunk = real
            gc.enable()
        assert len(seen) == 4 and all(r.reward is not None for r in rewards)
        assert all(ref() is None for chunk in seen[:3] for ref in chunk)  # only what is still referenced lives on


@pytest.mark.slow
def test_a_chunk_that_fails_unexpectedly_fails_only_its_candidates(tiny_bundle, monkeypatch):
    clips = [Clip(moving_square(5, 64, 96, seed=60 + i), fps=1) for i in range(6)]
    with RewardModel.from_pretrained(tiny_bundle, device="cpu", group_chunk=2) as m:
        want = [r.reward for r in m.score_group("p", CTXS[0], clips)]
        real, calls = m.runtime.group, []

        def flaky(enc, prefix):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 275251200 bytes")
            return real(enc, prefix)

        monkeypatch.setattr(m.runtime, "group", flaky)
        out = m.score_group("p", CTXS[0], clips, errors="return")
        assert [type(r).__name__ for r in out[2:4]] == ["InternalError"] * 2 and "can't allocate" in str(out[2])
        assert [out[i].reward for i in (0, 1, 4, 5)] == [want[i] for i in (0, 1, 4, 5)]
