"""Several reward models by name behind one service, and a swap under load (issue 39).

Two real bundles built by the same code path (the tiny bundle's writer, different weight seeds): the
model is swapped back and forth while client threads score without pause; no request fails, and every
reward is the in-process ``RewardModel.score`` of the revision that answered it, bit for bit."""

import json
import shutil
import threading
import time

import pytest

from nvrm import Clip, RewardModel
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle
from nvrm.synth.clips import moving_square
from nvrm.serve.models.model_swap import ADMIN_HEADER
from nvrm.serve.models.served import NamedModels, parse_model_specs
from nvrm.serve.models.weights import manifest_sha256
from helpers import InProcessServer

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(3)]
KEY = "admin-secret"


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("swaps")
    a = build_tiny_bundle(root / "a")
    b = build_tiny_bundle(root / "b", ArchSpec(seed=7))
    bad = root / "bad"
    shutil.copytree(b, bad)
    weights = sorted(bad.glob("*.safetensors"))[0]
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte: the manifest's sha256 no longer matches
    weights.write_bytes(bytes(data))
    other = build_tiny_bundle(root / "other", ArchSpec(seed=7), contract_overrides={"candidate_seconds": 4.0})
    outside = build_tiny_bundle(tmp_path_factory.mktemp("outside") / "x", ArchSpec(seed=7))
    return {"root": root, "a": a, "b": b, "bad": bad, "other": other, "outside": outside}


@pytest.fixture(scope="module")
def models(bundles):
    ms = {k: RewardModel.from_pretrained(bundles[k], device="cpu") for k in ("a", "b")}
    yield ms
    for m in ms.values():
        m.close()


@pytest.fixture(scope="module")
def expected(bundles, models):
    """revision -> the in-process rewards of CANDS."""
    return {manifest_sha256(bundles[k]): [m.score("p", CTX, c).reward for c in CANDS] for k, m in models.items()}


@pytest.fixture()
def server(bundles, models):
    own = RewardModel.from_pretrained(bundles["a"], device="cpu")  # its own: a swap frees (closes) the revision it replaces
    s = InProcessServer(own, allow_dirs=(str(bundles["root"]),), admin_key=KEY, max_wait_ms=2)
    yield s
    s.stop()


def put(server, name, path, key=KEY):
    headers = {"content-type": "application/json", **({ADMIN_HEADER: key} if key else {})}
    return server.http.put(f"/v1/models/{name}", content=json.dumps({"path": str(path)}), headers=headers, timeout=120)


def served(server):
    return {m["name"]: m["revision"] for m in server.get("/v1/models").json()["models"] if m["state"] == "serving"}


def test_model_specs_parse():
    assert parse_model_specs("bundles/x") == [("nvrm", "bundles/x")]
    assert parse_model_specs(["a=/b/a", "mine=/b/m"]) == [("a", "/b/a"), ("mine", "/b/m")]
    with pytest.raises(Exception, match="twice"):
        parse_model_specs(["a=/x", "a=/y"])


@pytest.mark.slow
def test_three_swaps_under_load_lose_nothing_and_mix_no_revisions(server, bundles, expected):
    rev_a, rev_b = manifest_sha256(bundles["a"]), manifest_sha256(bundles["b"])
    assert rev_a != rev_b and expected[rev_a] != expected[rev_b]
    stop = threading.Event()
    seen: list[tuple[str, int, float]] = []
    failures: list[str] = []

    def score(k):
        c = server.client(retries=0)
        i = 0
        while not stop.is_set():
            j = (k + i) % len(CANDS)
            try:
                r = c.score("p", CTX, CANDS[j], exact=True)
                seen.append((r.model_revision, j, r.reward))
            except Exception as e:  # noqa: BLE001
                failures.append(f"client {k} request {i}: {e}")
            i += 1
        c.close()

    threads = [threading.Thread(target=score, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        for target, rev in (("b", rev_b), ("a", rev_a), ("b", rev_b)):
            time.sleep(0.5)
            r = put(server, "nvrm", bundles[target])
            assert r.status_code == 200, r.text
            assert r.json()["revision"] == rev
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert {rev for rev, _, _ in seen} == {rev_a, rev_b}
    for rev, j, reward in seen:
        assert reward == expected[rev][j], (rev, j, reward)
    deadline = time.time() + 30  # the retired revisions drain, then are freed
    while len(server.get("/v1/models").json()["models"]) > 1 and time.time() < deadline:
        time.sleep(0.1)
    (only,) = server.get("/v1/models").json()["models"]
    assert only["revision"] == rev_b and only["state"] == "serving"


def test_models_listing_and_per_result_revision(server, bundles):
    (m,) = server.get("/v1/models").json()["models"]
    assert m["name"] == "nvrm" and m["revision"] == manifest_sha256(bundles["a"])
    assert m["state"] == "serving" and m["memory_bytes"] > 0 and len(m["contract"]) >= 16
    r = server.client(model="nvrm").score_batch([("p", CTX, CANDS[0])], exact=True)
    assert r[0].model_revision == m["revision"]
    body = server.client(transport="json", presample=False, context_refs=False)._items([("p", CTX, CANDS[0])], True)[1]
    raw = server.post("/v1/score", content=json.dumps(body), headers={"content-type": "application/json"})
    assert raw.status_code == 200, raw.text
    row = raw.json()["results"][0]
    assert row["model"] == "nvrm" and row["model_revision"] == m["revision"]


def test_unknown_model_and_pinned_revision(server, bundles):
    from nvrm.client import ServiceError

    with pytest.raises(ServiceError, match="nvrm") as e:
        server.client(model="nope", retries=0).score("p", CTX, CANDS[0])
    assert e.value.status == 400 and "nope" in str(e.value)
    with pytest.raises(ServiceError) as e:
        server.client(expect_revision="feedbeef", retries=0).score("p", CTX, CANDS[0])
    assert e.value.status == 409 and "feedbeef" in str(e.value) and manifest_sha256(bundles["a"]) in str(e.value)
    rev = manifest_sha256(bundles["a"])
    assert server.client(expect_revision=rev).score("p", CTX, CANDS[0]).model_revision == rev


def test_swap_refusals_change_nothing(server, bundles):
    before = served(server)
    cases = [
        (put(server, "nvrm", bundles["b"], key=None), 401, "admin key"),
        (put(server, "nvrm", bundles["b"], key="wrong"), 403, "admin key"),
        (put(server, "nvrm", bundles["outside"]), 403, "allow-dir"),
        (put(server, "nvrm", bundles["bad"]), 400, "verification"),
        (put(server, "nvrm", bundles["other"]), 409, "allow-contract-change"),
        (put(server, "nope", bundles["b"]), 400, "nvrm"),
    ]
    assert server.serving.registry.swapping.acquire(blocking=False)  # a swap "running"
    try:
        cases.append((put(server, "nvrm", bundles["b"]), 409, "another model swap"))
    finally:
        server.serving.registry.swapping.release()
    for r, status, words in cases:
        assert r.status_code == status, r.text
        message = r.json()["error"]["message"]
        assert words in message and "\n" not in message, message
    assert served(server) == before
    assert server.client().score("p", CTX, CANDS[0]).model_revision == before["nvrm"]


def test_a_swap_from_a_hub_repo_pinned_to_a_revision(server, bundles, tmp_path, monkeypatch):
    """PUT {"repo", "revision"}: the bundle through huggingface_hub, here from its cache (no Hub is reachable from these
    machines: offline mode, and a cache laid out as huggingface_hub lays it out); refusals in one line, nothing changed."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--worl--nvrm-retrained"
    shutil.copytree(bundles["b"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def hub(body):
        headers = {"content-type": "application/json", ADMIN_HEADER: KEY}
        return server.http.put("/v1/models/nvrm", content=json.dumps(body), headers=headers, timeout=120)

    before = served(server)
    for body, status, words in [
        ({"repo": "worl/nvrm-retrained"}, 400, "pinned to a revision"),
        ({"repo": "worl/absent", "revision": commit}, 502, "cannot download worl/absent"),
        ({"repo": "not a repo", "revision": commit}, 400, "not a Hub repo id"),
        ({"repo": "worl/nvrm-retrained", "revision": commit, "path": str(bundles["b"])}, 400, "both a path and a repo"),
    ]:
        r = hub(body)
        message = r.json()["error"]["message"]
        assert r.status_code == status and words in message and "\n" not in message, (body, r.text)
    assert served(server) == before
    r = hub({"repo": "worl/nvrm-retrained", "revision": commit})
    assert r.status_code == 200, r.text
    assert r.json()["revision"] == manifest_sha256(bundles["b"]) != before["nvrm"]
    assert server.client().score("p", CTX, CANDS[0]).model_revision == manifest_sha256(bundles["b"])
    assert put(server, "nvrm", bundles["a"]).status_code == 200
    r = hub({"repo": "worl/nvrm-retrained", "revision": "main"})  # a branch, through the cache's refs
    assert r.status_code == 200 and r.json()["revision"] == manifest_sha256(bundles["b"]), r.text


def test_several_named_models(bundles, models, expected):
    specs = [("a", str(bundles["a"])), ("mine", str(bundles["b"]))]
    loaded = iter([models["a"], models["b"]])
    s = InProcessServer(NamedModels(specs, lambda _: next(loaded)))
    try:
        deadline = time.time() + 60
        while s.get("/readyz").status_code != 200 and time.time() < deadline:
            time.sleep(0.05)
        assert [m["name"] for m in s.get("/v1/models").json()["models"]] == ["a", "mine"]
        for name, key in (("a", "a"), ("mine", "b"), (None, "a")):
            r = s.client(model=name).score("p", CTX, CANDS[1], exact=True)
            assert r.model_revision == manifest_sha256(bundles[key]) and r.reward == expected[r.model_revision][1]
        body = s.client(transport="json", presample=False, context_refs=False)._items([("p", CTX, CANDS[1])], True)[1]
        job = s.post("/v1/jobs/score", content=json.dumps({**body, "model": "mine"}), headers={"content-type": "application/json"})
        assert job.status_code == 200, job.text
        deadline = time.time() + 60
        while (done := s.get(f"/v1/jobs/{job.json()['id']}")).status_code == 202 and time.time() < deadline:
            time.sleep(0.05)
        (row,) = done.json()["results"]  # a job is scored by the model it names, and says so
        assert row["model"] == "mine" and row["model_revision"] == manifest_sha256(bundles["b"]) and done.json()["model"]["name"] == "mine"
        assert row["reward"] == expected[row["model_revision"]][1]
    finally:
        s.stop()


def test_bundle_weight_bytes_reads_the_safetensors_headers(bundles):
    from safetensors import safe_open

    from nvrm.serve.models.weights import bundle_weight_bytes, free_memory

    want = 0
    for f in sorted(bundles["b"].glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            want += sum(st.get_tensor(k).numel() * st.get_tensor(k).element_size() for k in st.keys())
    assert bundle_weight_bytes(bundles["b"]) == want > 0
    assert free_memory("cpu") > want  # this host's available RAM


def test_a_bundle_that_does_not_fit_beside_is_refused_with_one_line(server, bundles):
    before = served(server)
    server.serving.free_memory = lambda device: 4096  # an injected figure: far less than the bundle's weights
    r = put(server, "nvrm", bundles["b"])
    message = r.json()["error"]["message"]
    assert r.status_code == 507 and "--swap-mode replace" in message and "GiB" in message and "\n" not in message, r.text
    assert served(server) == before
    server.serving.free_memory = lambda device: 1 << 40
    assert put(server, "nvrm", bundles["b"]).status_code == 200


def test_swap_mode_replace_drains_then_loads_and_says_so(bundles, expected):
    rev_a, rev_b = manifest_sha256(bundles["a"]), manifest_sha256(bundles["b"])
    own = RewardModel.from_pretrained(bundles["a"], device="cpu")
    s = InProcessServer(own, allow_dirs=(str(bundles["root"]),), admin_key=KEY, swap_mode="replace")
    try:
        s.serving.free_memory = lambda device: 4096  # would not fit beside: replace drains the old revision first
        r = put(s, "nvrm", bundles["b"])
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["swap_mode"] == "replace" and body["revision"] == rev_b and rev_a in body["note"] and "drained" in body["note"]
        (only,) = s.get("/v1/models").json()["models"]  # the old revision was freed before the new one loaded
        assert only["revision"] == rev_b and only["state"] == "serving"
        assert s.client().score("p", CTX, CANDS[0], exact=True).reward == expected[rev_b][0]
        bad = put(s, "nvrm", bundles["other"])  # another contract: refused after the drain, so the old bundle is loaded again
        message = bad.json()["error"]["message"]
        assert bad.status_code == 409 and "loaded again" in message and "\n" not in message, bad.text
        assert served(s) == {"nvrm": rev_b}
        assert s.client().score("p", CTX, CANDS[1], exact=True).reward == expected[rev_b][1]
    finally:
        s.stop()


# ---------------------------------------------------------------- the done-when load test (issue 39)

SWAP_EVERY_S = 15.0
"""Traffic before, between and after the 3 swaps: the scoring window is 4 x this (24 s) plus the swaps' own time."""


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def demo_and_retrained(tmp_path_factory):
    """The demo bundle (copied under the server's --allow-dir) and one retrained from it by ``nvrm train``."""
    from nvrm.cli.demo import demo_bundle_path
    from nvrm.cli.main import main

    root = tmp_path_factory.mktemp("load")
    demo = root / "demo"
    shutil.copytree(demo_bundle_path(), demo)
    task = tmp_path_factory.mktemp("load-task")
    assert main(["prefs", "synth", "--out", str(task), "--train", "2", "--eval", "1", "--seed", "3", "--variants", "freeze,reverse"]) == 0
    out = root / "run"
    assert main(["train", "--base", str(demo), "--pairs", str(task / "train_pairs.jsonl"), "--output", str(out), "--epochs", "1",
                 "--batch-pairs", "4", "--lora-rank", "4", "--head-lr", "0.05"]) == 0  # a head that moves: rewards that differ
    summary = json.loads((out / "summary.json").read_text())
    return root, demo, summary["bundle"]


@pytest.mark.slow
def test_done_when_8_clients_score_without_pause_while_the_demo_bundle_and_a_retrained_one_swap_3_times(demo_and_retrained):
    """Issue 39's done-when, with ``nvrm serve`` in its own process: 8 client threads score without pause for 60 s
    (4 x ``SWAP_EVERY_S``) plus the 3 swaps' own time, while the model is swapped demo -> retrained -> demo ->
    retrained (the window is asserted to be at least 60 s). 0 requests fail (no
    client retries); each result's ``model_revision`` was live during its request, and its reward is in-process
    ``RewardModel.score`` of that revision bit for bit; once the last retired revision has drained, the server's
    RSS is within 10 % of its RSS before the first swap."""
    from helpers import Server
    from nvrm.client import RewardClient

    root, demo, retrained = demo_and_retrained
    revs = {manifest_sha256(demo): demo, manifest_sha256(retrained): retrained}
    rev_demo, rev_new = manifest_sha256(demo), manifest_sha256(retrained)
    assert len(revs) == 2
    expected = {}
    for rev, path in revs.items():
        with RewardModel.from_pretrained(path, device="cpu") as m:
            expected[rev] = [m.score("p", CTX, c).reward for c in CANDS]
    assert expected[rev_demo] != expected[rev_new]  # the retrained bundle scores differently

    server = Server(f"nvrm={demo}", "--device", "cpu", "--allow-dir", root, "--admin-key-env", "NVRM_LOAD_ADMIN", "--max-wait-ms", "2",
                    env={"NVRM_LOAD_ADMIN": KEY})
    stop = threading.Event()
    seen: list[tuple[float, float, str, int, float]] = []
    failures: list[str] = []

    def score(k):
        c = RewardClient(server.url, retries=0)
        i = 0
        while not stop.is_set():
            j = (k + i) % len(CANDS)
            t0 = time.monotonic()
            try:
                r = c.score("p", CTX, CANDS[j], exact=True)
                seen.append((t0, time.monotonic(), r.model_revision, j, r.reward))
            except Exception as e:  # noqa: BLE001
                failures.append(f"client {k} request {i}: {e}")
            i += 1
        c.close()

    def put_path(path):
        import httpx

        return httpx.put(server.url + "/v1/models/nvrm", content=json.dumps({"path": str(path)}),
                         headers={"content-type": "application/json", ADMIN_HEADER: KEY}, timeout=300)

    threads = [threading.Thread(target=score, args=(k,)) for k in range(8)]
    live = [[rev_demo, float("-inf"), float("inf")]]
    puts: list[str] = []  # revision, live from (its PUT began), live until (the next PUT ended)
    try:
        for t in threads:
            t.start()
        time.sleep(SWAP_EVERY_S)
        rss_before = _rss(server.proc.pid)
        for target in (retrained, demo, retrained):
            began = time.monotonic()
            r = put_path(target)
            ended = time.monotonic()
            puts.append(f"{ended - began:.1f}")
            assert r.status_code == 200, r.text
            assert r.json()["previous_revision"] == live[-1][0] and r.json()["swap_mode"] == "beside"
            live[-1][2] = ended
            live.append([r.json()["revision"], began, float("inf")])
            time.sleep(SWAP_EVERY_S)
        stop.set()
        for t in threads:
            t.join()
        deadline = time.time() + 60  # the retired revisions drain, then are freed
        while len(server.get("/v1/models").json()["models"]) > 1 and time.time() < deadline:
            time.sleep(0.1)
        (only,) = server.get("/v1/models").json()["models"]
        rss_drained = _rss(server.proc.pid)
        time.sleep(3)  # idle: the server's trimmer hands freed pages back 1 s after the last request (nvrm.serve.admission.memory)
        rss_after = _rss(server.proc.pid)
    finally:
        stop.set()
        for t in threads:
            t.join()
        server.stop()
    assert failures == [], failures[:5]
    assert only["revision"] == rev_new and only["state"] == "serving"
    assert [rev for rev, *_ in live] == [rev_demo, rev_new, rev_demo, rev_new]
    assert {rev for _, _, rev, _, _ in seen} == {rev_demo, rev_new}
    for _, began, _ in live[1:]:  # traffic on both sides of every switch: requests answered before each PUT and after it
        assert any(t1 < began for _, t1, *_ in seen) and any(t0 > began for t0, *_ in seen)
    for t0, t1, rev, j, reward in seen:
        assert any(r == rev and start <= t1 and until >= t0 for r, start, until in live), (t0, t1, rev)  # live during it
        assert reward == expected[rev][j], (rev, j, reward)  # bit for bit
    assert abs(rss_after - rss_before) <= 0.10 * rss_before, (rss_before, rss_after)
    window = max(t1 for _, t1, *_ in seen) - min(t0 for t0, *_ in seen)
    assert window >= 60, window  # the 60 s of scoring without pause
    print(f"load test: {len(seen)} results from 8 clients in {window:.1f} s, 3 swaps (each PUT {', '.join(puts)} s), "
          f"RSS {rss_before / 2**20:.0f} -> {rss_drained / 2**20:.0f} MiB once drained -> {rss_after / 2**20:.0f} MiB idle")


def test_watch_is_refused_on_ray_and_points_at_the_rolling_put(bundles, capsys):
    """(Swaps on Ray Serve roll over the replicas: tests/e2e/test_ray_serve.py.) ``--watch`` would swap each replica
    on its own, so it is refused, before Ray starts, in one line."""
    from nvrm.cli.main import main

    assert main(["serve", "--model", str(bundles["a"]), "--ray", "--watch", f"nvrm={bundles['root']}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--watch" in err and "PUT /v1/models/NAME" in err and "\n" not in err
