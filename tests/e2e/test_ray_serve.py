"""nvrm serve --ray: the same app as Ray Serve replicas, on a local Ray cluster with CPU replicas."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import ray.serve  # noqa: F401 - installed by the test extra: these tests run in CI, never skipped
from helpers import GROUP_ULPS, bf16_ulp, in_threads
from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.serve.models.model_swap import ADMIN_HEADER
from nvrm.serve.models.weights import manifest_sha256
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle
from nvrm.synth.clips import moving_square

pytestmark = pytest.mark.exclusive  # a local Ray cluster of its own: one at a time under make test's two workers

NVRM = Path(sys.executable).parent / "nvrm"
DEMO = Path(__file__).resolve().parents[2] / "src" / "nvrm" / "assets" / "demo-bundle"
"""The second served model (``--model mine=DEMO``): every replica holds both, by name."""
ADMIN = "admin-secret"
CTX = Clip(moving_square(8, 64, 80, seed=1), fps=4)
CANDS = [Clip(moving_square(20, 64, 80, seed=10 + i, speed=1 + i), fps=4) for i in range(3)]


@pytest.fixture(scope="module")
def other_bundle(tmp_path_factory):
    """A second bundle of the tiny bundle's contract, other weights (the same writer, another seed): the swap's target."""
    return build_tiny_bundle(tmp_path_factory.mktemp("rollto") / "b", ArchSpec(seed=7))


@pytest.fixture(scope="module")
def ray_server(tiny_bundle, other_bundle, tmp_path_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("rayserve") / "serve.log", "w+")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [str(NVRM), "serve", "--model", str(tiny_bundle), "--model", f"mine={DEMO}", "--ray", "--replicas", "2", "--cpus-per-replica", "0.5",
         "--port", str(port), "--api-key-env", "NVRM_KEY", "--admin-key-env", "NVRM_ADMIN",
         "--allow-dir", str(tiny_bundle.parent), "--allow-dir", str(other_bundle.parent)],
        stdout=log, stderr=subprocess.STDOUT, env={**env, "NVRM_KEY": "k", "NVRM_ADMIN": ADMIN},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        assert proc.poll() is None, _tail(log)
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        raise AssertionError("ray serve did not become ready: " + _tail(log))
    yield url, proc, log
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()


def _tail(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-3000:]


def test_replicas_answer_like_the_model_and_share_the_load(ray_server, model):
    url, _, _ = ray_server
    client = RewardClient(url, api_key="k", presample=False, context_refs=False)  # whole clips, no routing header
    want = [model.score("p", CTX, c).reward for c in CANDS]
    bodies = []
    body, payload = client._group("p", CTX, CANDS, False)
    kw = body.request(payload)
    kw["headers"] = {**kw["headers"], "Authorization": "Bearer k"}

    def hit() -> None:
        r = httpx.post(url + "/v1/score_group", timeout=120, **kw)
        bodies.append((r.status_code, r.json()))

    for _ in range(3):  # concurrent requests, so the router has a reason to use both replicas
        in_threads(lambda _: hit(), 8)
    replicas = set()
    for status, body in bodies:
        assert status == 200, body
        assert all(abs(x["reward"] - w) <= GROUP_ULPS * bf16_ulp(w) for x, w in zip(body["results"], want))
        replicas.add(body["replica"])  # a group is one request: one replica scored all of it
    assert len(bodies) == 24 and len(replicas) == 2, replicas  # Ray Serve routed between the two replicas


def test_every_replica_serves_both_named_models(ray_server, model):
    """``--ray`` with ``--model NAME=DIR`` repeated: each replica loads both; a request naming ``mine`` is scored by it."""
    from nvrm import RewardModel

    url, _, _ = ray_server
    listed = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k"}, timeout=60).json()
    assert listed["default"] == "nvrm" and [m["name"] for m in listed["models"]] == ["nvrm", "mine"]
    with RewardModel.from_pretrained(DEMO, device="cpu") as demo:
        want = [demo.score("p", CTX, c).reward for c in CANDS]
        revision = listed["models"][1]["revision"]
    client = RewardClient(url, api_key="k", model="mine", presample=False, context_refs=False)
    mine, default = [], RewardClient(url, api_key="k", presample=False, context_refs=False)

    def hit(_) -> None:
        mine.append(client.score_group("p", CTX, CANDS))

    in_threads(hit, 6)  # concurrent, so both replicas take some
    for results in mine:
        assert all(abs(r.reward - w) <= GROUP_ULPS * bf16_ulp(w) for r, w in zip(results, want))
        assert {r.model_revision for r in results} == {revision}
    base = default.score_group("p", CTX, CANDS)  # no model named: the first, the tiny bundle
    assert all(abs(r.reward - model.score("p", CTX, c).reward) <= GROUP_ULPS * bf16_ulp(r.reward) for r, c in zip(base, CANDS))
    assert want != [r.reward for r in base]


def test_requests_naming_one_context_go_to_the_replica_that_holds_it(ray_server, model):
    """Routing on the context hash (Ray Serve multiplexing): one context, one replica, one upload."""
    url, _, _ = ray_server
    client = RewardClient(url, api_key="k")
    inline = []  # per request: whether its context travelled inline (first time, or after a miss)
    builds = []
    build = client._group

    def group(*args, **kw):
        body, payload = build(*args, **kw)
        builds.append(not body.by_ref)  # the last build of a request is the body that was sent
        return body, payload

    client._group = group
    answered: dict[int, list[str]] = {}
    for rnd in range(4):
        for k in range(6):
            ctx = CONTEXTS[k]
            out = client._post("/v1/score_group", lambda inline_: client._group(f"p{k}", ctx, CANDS[:1], False, inline_))
            inline.append(builds[-1])
            answered.setdefault(k, []).append(out["replica"])
            if rnd == 0:
                assert out["results"][0]["reward"] == model.score(f"p{k}", ctx, CANDS[0]).reward
        if rnd == 0:
            time.sleep(2.0)  # Ray Serve learns a replica's held hashes from its reports (pushed every 0.1 s, then
            # broadcast to the proxy): give the first uploads that long, so later rounds measure routing, not lag
    homes = {k: max(set(v), key=v.count) for k, v in answered.items()}
    routed = sum(r == homes[k] for k, v in answered.items() for r in v) / sum(len(v) for v in answered.values())
    hit_rate = (len(inline) - sum(inline)) / (len(inline) - len(CONTEXTS))  # later requests served by ref, no resend
    print(f"routing: {routed:.2f} of {len(inline)} requests on their context's replica; context-store hit rate {hit_rate:.2f} "
          f"({sum(inline)} inline sends for {len(CONTEXTS)} contexts); replicas used {len(set(homes.values()))}")
    # a miss (a by-ref request routed elsewhere) registers nothing, so no replica claims a context it lacks
    assert routed >= 0.9 and hit_rate >= 0.8


CONTEXTS = [Clip(moving_square(8, 64, 80, seed=300 + k), fps=4) for k in range(6)]


def test_auth_and_limits_hold_on_every_replica(ray_server):
    url, _, _ = ray_server
    assert httpx.get(url + "/healthz").status_code == 200
    assert httpx.get(url + "/v1/info").status_code == 401
    info = httpx.get(url + "/v1/info", headers={"Authorization": "Bearer k"}).json()
    assert info["limits"]["auth"] is True and info["limits"]["max_request_items"] == 256
    bad = httpx.post(url + "/v1/score", content=b"{oops", headers={"Authorization": "Bearer k", "content-type": "application/json"}, timeout=60)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]


def _put(url, name, path, key=ADMIN):
    headers = {"Authorization": "Bearer k", "content-type": "application/json", **({ADMIN_HEADER: key} if key else {})}
    return httpx.put(f"{url}/v1/models/{name}", json={"path": str(path)}, headers=headers, timeout=600)


def test_a_swap_rolls_over_the_replicas_one_at_a_time_while_clients_score(ray_server, tiny_bundle, other_bundle, model, tmp_path):
    """PUT /v1/models/nvrm under --ray: the replica it reaches swaps, then the other, in turn; no request fails, every
    reward is its revision's in-process reward, and once the PUT answers no replica serves the old revision.
    (It swaps back at the end; only the SIGTERM test comes after it.)"""
    from nvrm import RewardModel

    url, _, log = ray_server
    rev_a, rev_b = manifest_sha256(tiny_bundle), manifest_sha256(other_bundle)
    with RewardModel.from_pretrained(other_bundle, device="cpu") as b:
        want = {rev_a: [model.score("p", CTX, c).reward for c in CANDS], rev_b: [b.score("p", CTX, c).reward for c in CANDS]}
    assert rev_a != rev_b and all(x != y for x, y in zip(want[rev_a], want[rev_b]))

    # refusals first: each one line, and nothing changes on any replica
    assert _put(url, "nvrm", other_bundle, key=None).status_code == 401
    assert _put(url, "nvrm", other_bundle, key="wrong").status_code == 403
    bad = tmp_path / "bad"  # not under an --allow-dir
    assert _put(url, "nvrm", bad).status_code == 403
    flipped = other_bundle.parent / "flipped"
    shutil.copytree(other_bundle, flipped)
    weights = sorted(flipped.glob("*.safetensors"))[0]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    r = _put(url, "nvrm", flipped)
    assert r.status_code == 400 and "fails verification" in r.json()["error"]["message"] and "\n" not in r.json()["error"]["message"], r.text

    stop = threading.Event()
    seen: list[tuple[float, str, str, int, float]] = []  # (sent at, revision, replica, candidate, reward)
    failures: list[str] = []

    def score(k: int) -> None:
        c = RewardClient(url, api_key="k", presample=False, context_refs=False, retries=0)
        i = 0
        while not stop.is_set():
            j = (k + i) % len(CANDS)
            t0 = time.time()
            try:
                out = c._post("/v1/score", lambda inline: c._items([("p", CTX, CANDS[j])], True, inline))
                row = out["results"][0]
                seen.append((t0, row["model_revision"], out["replica"], j, row["reward"]))
            except Exception as e:  # noqa: BLE001
                failures.append(f"client {k} request {i}: {e}")
            i += 1

    clients = [threading.Thread(target=score, args=(k,)) for k in range(4)]
    for t in clients:
        t.start()
    answers: list[httpx.Response] = []
    try:
        time.sleep(2.0)
        first = threading.Thread(target=lambda: answers.append(_put(url, "nvrm", other_bundle)))
        first.start()
        time.sleep(0.5)
        answers.append(_put(url, "nvrm", other_bundle))  # while the first rolls: 409
        first.join()
        rolled_at = time.time()
        time.sleep(3.0)
    finally:
        stop.set()
        for t in clients:
            t.join()
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    done = next(a.json() for a in answers if a.status_code == 200)
    assert done["revision"] == rev_b and done["previous_revision"] == rev_a
    turns = done["replicas"]
    assert len({t["replica"] for t in turns}) == 2 and {t["revision"] for t in turns} == {rev_b}, turns
    assert turns[0]["finished"] <= turns[1]["started"], turns  # one replica at a time
    assert failures == [], failures[:3]
    other = {rev_a: rev_b, rev_b: rev_a}
    for _, rev, _, j, reward in seen:  # a replica runs on its own CPU share (one thread), so a few ulps, as in the tests above;
        w = want[rev][j]  # and nearer its own revision's reward than the other's
        assert abs(reward - w) <= GROUP_ULPS * bf16_ulp(w) and abs(reward - w) < abs(reward - want[other[rev]][j]), (rev, j, reward)
    before = [s for s in seen if s[0] < turns[0]["started"]]
    after = [s for s in seen if s[0] > rolled_at]
    assert before and {s[1] for s in before} == {rev_a}
    assert after and {s[1] for s in after} == {rev_b}, {(s[1], s[2]) for s in after}  # no replica left on the old revision
    assert len({s[2] for s in after}) == 2  # both replicas answered after the roll
    print(f"rolling swap: {len(seen)} results from 4 clients, turns "
          + ", ".join(f"{t['replica'][-6:]} {t['finished'] - t['started']:.1f} s" for t in turns))

    back = _put(url, "nvrm", tiny_bundle)  # as the module began
    assert back.status_code == 200 and back.json()["revision"] == rev_a, back.text


def test_sigterm_stops_the_deployment(ray_server):
    url, proc, log = ray_server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    assert "nvrm serve: stopped" in _tail(log)
