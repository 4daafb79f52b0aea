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
from nvrm.serve.model_swap import ADMIN_HEADER
from nvrm.serve.models import NamedModels, manifest_sha256, parse_model_specs
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
    finally:
        s.stop()
