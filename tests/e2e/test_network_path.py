"""The network path: sample before upload, contexts by content hash, one upload per context.

The service app in process; clients with the defaults (sampling before upload, context refs) against
clients that send everything whole. Rewards must be equal; bytes must drop by the frame ratio.
"""

from __future__ import annotations

import json

import httpx
import pytest

from helpers import InProcessServer, in_threads
from nvrm import Clip
from nvrm.protocol import context_ref, npy_bytes
from nvrm.synth.clips import moving_square

CTX = Clip(moving_square(24, 64, 96, seed=1), fps=4)
# a flow-GRPO group: 81 frames at 16 fps (5.06 s), of which the contract uses 5
GROUP = [Clip(moving_square(81, 64, 96, seed=10 + i, speed=1 + i % 3), fps=16) for i in range(8)]


@pytest.fixture(scope="module")
def server(model):
    s = InProcessServer(model, max_wait_ms=10)
    yield s
    s.stop()


def metrics(server) -> dict[str, float]:
    out = {}
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("nvrm_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def sent(server, endpoint: str) -> float:
    return metrics(server).get(f'nvrm_request_bytes_total{{endpoint="{endpoint}"}}', 0.0)


def test_info_publishes_the_time_plan(server, model):
    info = server.get("/v1/info").json()["contract"]
    assert info["contract_fields_fingerprint"] == model.contract.fingerprint
    assert info["sampling"] == {"sample_fps": 1.0, "candidate_seconds": 5.0, "candidate_frames": 5, "max_context_frames": None,
                                "short_candidates": False, "no_context": False}


def test_a_group_uploads_over_ten_times_fewer_bytes_with_equal_rewards(server, model):
    whole = server.client(presample=False, context_refs=False)
    before = sent(server, "group")
    want = [r.reward for r in whole.score_group("p", CTX, GROUP)]
    whole_bytes = sent(server, "group") - before

    lean = server.client()
    before, up_before = sent(server, "group"), sent(server, "contexts")
    got = lean.score_group("p", CTX, GROUP)
    lean_bytes = sent(server, "group") - before + sent(server, "contexts") - up_before
    assert [r.reward for r in got] == want == [r.reward for r in model.score_group("p", CTX, GROUP)]
    assert [r.candidate_times for r in got] == [r.candidate_times for r in model.score_group("p", CTX, GROUP)]
    assert whole_bytes / lean_bytes >= 10, (whole_bytes, lean_bytes)


def test_a_context_shared_by_clients_is_uploaded_once(server):
    ctx = Clip(moving_square(16, 64, 96, seed=77), fps=4)  # new to this server
    m0 = metrics(server)
    before_bytes = sent(server, "group")
    rewards = [[r.reward for r in server.client().score_group("q", ctx, GROUP[:2])] for _ in range(3)]
    m1 = metrics(server)
    assert rewards[0] == rewards[1] == rewards[2]
    kept = m1.get("nvrm_context_store_puts_total", 0) - m0.get("nvrm_context_store_puts_total", 0)
    hits = m1.get('nvrm_context_store_total{result="hit"}', 0) - m0.get('nvrm_context_store_total{result="hit"}', 0)
    ctx_bytes = len(npy_bytes(ctx.numpy()[::4]))  # the 4 sampled context frames
    sent_bytes = (sent(server, "group") - before_bytes)
    assert kept == 1 and hits >= 4  # sent inline once; clients 2 and 3 asked for it and named it by ref
    cand_bytes = len(npy_bytes(GROUP[0].take([0] * 5)))
    assert sent_bytes < 3 * 2 * cand_bytes + 2 * ctx_bytes  # the context's frames travelled once, not three times
    assert m1["nvrm_context_store_bytes"] > 0


def post_frames(server, path: str, payload: dict, frames) -> httpx.Response:
    """A multipart request whose part "f" holds ``frames`` as .npy."""
    files = [("request", (None, json.dumps(payload), "application/json")), ("f", ("f", npy_bytes(frames), "application/octet-stream"))]
    return server.post(path, files=files)


def test_refused_samples_and_unknown_refs_are_clear_errors(server, model):
    frames = GROUP[0].take([0, 16, 32, 48, 64])
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    fp = model.contract.fingerprint
    ctx = {"part": "f", "times": times, "sampled": fp}
    r = post_frames(server, "/v1/score_group", {"prompt": "p", "context": ctx, "candidates": [{"part": "f", "times": times, "sampled": "0" * 64}]}, frames)
    assert r.status_code == 409 and r.json()["error"]["code"] == "contract_mismatch" and "/v1/info" in r.json()["error"]["message"]
    ref = context_ref(fp, data=b"never uploaded")
    r = server.post("/v1/score_group", json={"prompt": "p", "context": {"ref": ref}, "candidates": [{"path": "/x.mp4"}]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "context_unknown"
    assert server.get(f"/v1/contexts/{ref}").status_code == 404
    up = post_frames(server, "/v1/contexts", {"context": ctx}, frames)
    assert up.status_code == 200 and up.json()["ref"] == context_ref(fp, frames=frames, times=times)  # the same hash on both sides
    assert server.get(f"/v1/contexts/{up.json()['ref']}").status_code == 200
    four = {"prompt": "p", "context": {"ref": up.json()["ref"]}, "candidates": [{"part": "f", "times": times[:4], "sampled": fp}]}
    r = post_frames(server, "/v1/score_group", four, frames[:4])
    assert r.status_code == 400 and "5 frames" in r.json()["error"]["message"]  # a sampled candidate has the plan's count
    r = post_frames(server, "/v1/contexts", {"context": {"part": "f", "fps": 16.0}}, frames)
    assert r.status_code == 400 and "sampled" in r.json()["error"]["message"]  # raw frames are not kept unsampled


def test_an_evicted_context_is_uploaded_again(model):
    s = InProcessServer(model, context_store_mb=0.05)  # room for about two small contexts
    try:
        client = s.client()
        ctxs = [Clip(moving_square(4, 32, 64, seed=200 + k), fps=1) for k in range(4)]
        first = [client.score_group("p", c, GROUP[:1])[0].reward for c in ctxs]
        again = [client.score_group("p", c, GROUP[:1])[0].reward for c in ctxs]  # the early ones were evicted
        assert first == again
        m = metrics(s)
        assert m["nvrm_context_store_puts_total"] > 4 and m["nvrm_context_store_bytes"] <= 0.05 * 1024 * 1024
    finally:
        s.stop()


def test_short_and_bad_clips_still_fail_in_their_own_slot(server):
    client = server.client()
    short = Clip(moving_square(30, 64, 96, seed=3), fps=16)  # 1.9 s: the client cannot sample it
    out = client.score_group("p", CTX, [GROUP[0], short], errors="return")
    assert out[0].reward is not None and isinstance(out[1], Exception) and "1.88 s" in str(out[1])


def test_clients_naming_one_context_share_its_prefill(server, model):
    """Requests from different clients that name one context (by ref) share its prepared frames and prefill."""
    import threading

    ctx = Clip(moving_square(12, 64, 96, seed=91), fps=4)
    server.client().score("r", ctx, GROUP[0])  # the first client sends it inline; the server keeps it
    m0 = metrics(server)
    out, barrier = [None] * 4, threading.Barrier(4)

    def one(i):
        c = server.client()
        barrier.wait()
        out[i] = c.score("r", ctx, GROUP[1 + i]).reward

    in_threads(one, 4)
    m1 = metrics(server)
    assert out == [model.score("r", ctx, c).reward for c in GROUP[1:5]]
    assert m1["nvrm_shared_context_items_total"] - m0.get("nvrm_shared_context_items_total", 0) == 4  # every one shared
    assert m1.get('nvrm_context_store_total{result="hit"}', 0) - m0.get('nvrm_context_store_total{result="hit"}', 0) >= 4


def test_a_trainer_uploads_a_context_once_and_workers_name_it(server, model):
    ctx = Clip(moving_square(12, 64, 96, seed=93), fps=4)
    ref = server.client().upload_context(ctx)
    assert server.get(f"/v1/contexts/{ref}").status_code == 200
    before = sent(server, "group")
    got = server.client().score_group("u", ctx, GROUP[:2])  # a worker that never sent it
    cand_bytes = len(npy_bytes(GROUP[0].take([0] * 5)))
    assert sent(server, "group") - before < 2 * cand_bytes + 4096  # only the candidates travelled
    assert [r.reward for r in got] == [r.reward for r in model.score_group("u", ctx, GROUP[:2])]


def test_no_context_over_the_network_only_where_the_server_opts_in(server, tmp_path):
    import dataclasses

    from nvrm import Contract, RewardModel
    from nvrm.errors import ConfigError
    from nvrm.rl.scorer import RewardSource
    from nvrm.synth.bundles import build_tiny_bundle

    cands = GROUP[:3]
    refused = server.client().score_group("p", None, cands, errors="return")
    assert all(e.code == "invalid_input" and "no_context=True" in str(e) for e in refused), refused
    with pytest.raises(ConfigError, match=r"no_context=True: the server at .* nvrm_contract.json"):
        RewardSource(server.client(), no_context=True)
    bundle = build_tiny_bundle(tmp_path / "open", contract_overrides={"no_context": True})
    local = RewardModel.from_pretrained(bundle, device="cpu")
    s = InProcessServer(local, max_wait_ms=10)
    try:
        assert local.contract == dataclasses.replace(Contract.for_bundle(bundle), no_context=True)
        want = [r.reward for r in local.score_group("p", None, cands)]
        client = s.client()
        got = client.score_group("p", None, cands)
        assert [r.reward for r in got] == want and all(r.off_contract == ("no context",) for r in got)
        batch = client.score_batch([("p", None, c) for c in cands] + [("p", CTX, cands[0])])
        assert [r.off_contract for r in batch] == [("no context",)] * 3 + [()]
        assert [r.reward for r in batch[:3]] == pytest.approx(want, abs=0)  # packed batches equal score on the CPU
        assert RewardSource(s.client(), no_context=True).score(["p"], [None], [cands[0]])[0][0].reward == want[0]
    finally:
        s.stop()
        local.close()
