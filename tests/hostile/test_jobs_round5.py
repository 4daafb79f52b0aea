"""Hostile inputs, round 5 (#54 items 1, 2, 4, 5, 6, 7): the Redis job store (``--job-store redis://``) against a real
``redis-server``. A model swap loses no job; the shared result-bytes counter is the bytes held; a job is scored only by
the weights it was accepted for (or what a swap put in their place, saying so); a job that kills its replica fails
after a bounded number of deaths; the Redis password is in no answer, log line or metric; a Redis that may evict any
key is refused."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from helpers import InProcessServer, Server, free_port
from nvrm import Clip, RewardModel
from nvrm.errors import ConfigError
from nvrm.protocol import encode_frames
from nvrm.serve.models.model_swap import ADMIN_HEADER
from nvrm.serve.models.weights import manifest_sha256
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle
from nvrm.synth.clips import moving_square
from redis_server import RedisServer

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(3)]
_FRAMES = moving_square(5, 64, 32, seed=3)
JOB = {"items": [{"prompt": "p", "context": {"frames": encode_frames(_FRAMES[:2]), "fps": 1},
                  "candidate": {"frames": encode_frames(_FRAMES), "fps": 1}}]}
KEY = "round5-admin"


@pytest.fixture
def redis(tmp_path):
    with RedisServer(tmp_path / "redis") as r:
        yield r


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """``a`` and ``b``: tiny bundles that record the same revision (``tiny-test-0001``) but hold other weights (other
    manifests); ``retrained``: b's weights recording a revision of their own, as an export a swap loads does."""
    root = tmp_path_factory.mktemp("round5")
    a, b = build_tiny_bundle(root / "a"), build_tiny_bundle(root / "b", ArchSpec(seed=7))
    retrained = build_tiny_bundle(root / "retrained", ArchSpec(seed=7), revision="tiny-test-0002")
    assert json.loads((a / "RELEASE_MANIFEST.json").read_text()).get("revision") == \
        json.loads((b / "RELEASE_MANIFEST.json").read_text()).get("revision")
    return {"root": root, "a": a, "b": b, "retrained": retrained}


@pytest.fixture(scope="module")
def models(bundles):
    ms = {k: RewardModel.from_pretrained(bundles[k], device="cpu") for k in ("a", "b", "retrained")}
    yield ms
    for m in ms.values():
        m.close()


@pytest.fixture(scope="module")
def expected(bundles, models):
    """manifest sha256 (the revision answers name) -> the in-process rewards of ``score_group("p", CTX, CANDS)``."""
    return {manifest_sha256(bundles[k]): [r.reward for r in m.score_group("p", CTX, CANDS)] for k, m in models.items()}


def store(redis, namespace="t", **kw):
    from nvrm.serve.jobs.redis_store import RedisJobStore

    settings = {"max_jobs": 64, "ttl_s": 60.0, "max_result_bytes": 100_000, "lease_s": 30.0, "admit_grace_s": 60.0, **kw}
    return RedisJobStore(redis.url, namespace, **settings)


def queue(s, kind="v1:score", extra=None) -> str:
    import uuid

    jid = uuid.uuid4().hex
    assert s.admit(jid) is None and s.enqueue(jid, kind, "", extra or {}, b"{}", "application/json")
    return jid


def wait(call, pending=(202, 425), timeout=60):
    deadline = time.time() + timeout
    while (r := call()).status_code in pending and time.time() < deadline:
        time.sleep(0.05)
    return r


# ---------------------------------------------------------------- item 1: a model swap loses no job


def test_a_swap_on_a_real_server_answers_every_redis_job_it_had_accepted(bundles, expected, redis):
    """``nvrm serve --job-store redis://`` (its own process), 15 group jobs accepted, then ``PUT /v1/models/nvrm``: each
    of the 15 is answered (none 404), by the revision that accepted it, or by the new one with ``accepted_revision``
    naming the old; rewards are the in-process ones of the revision that answered."""
    from nvrm.client import RewardClient

    rev_a, rev_b = manifest_sha256(bundles["a"]), manifest_sha256(bundles["retrained"])
    assert expected[rev_a] != expected[rev_b]
    server = Server(bundles["a"], "--device", "cpu", "--job-store", redis.url, "--allow-dir", bundles["root"], "--admin-key-env",
                    "NVRM_R5_ADMIN", "--job-workers", "1", "--max-wait-ms", "2", env={"NVRM_R5_ADMIN": KEY})
    try:
        client = RewardClient(server.url)
        jobs = [client.submit_group("p", CTX, CANDS) for _ in range(15)]
        swap = httpx.put(
            server.url + "/v1/models/nvrm", content=json.dumps({"path": str(bundles["retrained"])}),
            headers={"content-type": "application/json", ADMIN_HEADER: KEY}, timeout=120)
        assert swap.status_code == 200 and swap.json()["revision"] == rev_b, swap.text
        answers = [wait(lambda j=j: server.get(f"/v1/jobs/{j.id}")) for j in jobs]
        codes = [a.status_code for a in answers]
        assert codes == [200] * 15, f"{codes.count(404)} of 15 accepted jobs answer 404 after the swap: {codes}"
        by = []
        for a in answers:
            body = a.json()
            assert body["status"] == "done", body
            (rev,) = {row["model_revision"] for row in body["results"]}
            assert [row["reward"] for row in body["results"]] == expected[rev]
            assert rev == rev_a or body.get("accepted_revision") == rev_a, body  # the new revision says so
            by.append(rev)
        assert rev_b in by, "no job was still queued at the swap (this test needs some)"
        later = client.submit_group("p", CTX, CANDS)  # and a job accepted after it is the new revision's
        assert [r.model_revision for r in later.result(timeout=60)] == [rev_b] * 3
        print(f"15 jobs across the swap: {by.count(rev_a)} by the old revision, {by.count(rev_b)} by the new one")
    finally:
        server.stop()


def test_a_replace_mode_swap_answers_every_redis_job_it_had_accepted(bundles, expected, redis):
    """``--swap-mode replace`` (the old revision drained and freed before the new one loads, 503 meanwhile): the same."""
    rev_a = manifest_sha256(bundles["a"])
    own = RewardModel.from_pretrained(bundles["a"], device="cpu")  # its own: the swap frees it
    with InProcessServer(own, job_store=redis.url, allow_dirs=(str(bundles["root"]),), admin_key=KEY, swap_mode="replace",
                         job_workers=1) as s:
        jobs = [s.client().submit_group("p", CTX, CANDS) for _ in range(6)]
        swap = s.http.put("/v1/models/nvrm", content=json.dumps({"path": str(bundles["retrained"])}),
                          headers={"content-type": "application/json", ADMIN_HEADER: KEY}, timeout=120)
        assert swap.status_code == 200 and swap.json()["swap_mode"] == "replace", swap.text
        for j in jobs:
            r = wait(lambda j=j: s.get(f"/v1/jobs/{j.id}"))
            body = r.json()
            assert r.status_code == 200 and body["status"] == "done", body
            (rev,) = {row["model_revision"] for row in body["results"]}
            assert [row["reward"] for row in body["results"]] == expected[rev]
            assert rev == rev_a or body["accepted_revision"] == rev_a, body


def test_a_swap_hands_the_old_revisions_queued_jobs_to_the_new_one(redis):
    """Store level: a replica at another revision takes none of a revision's jobs, until a swap from it is recorded."""
    old, new = store(redis), store(redis)
    old.bind("r1")
    new.bind("r2")
    jobs = [queue(old) for _ in range(3)]
    assert new.take("w2", 8) == []  # other weights: not its jobs
    taken = new.take("w2", 8, links=[("", "r1", "r2")])  # this replica swapped r1 -> r2
    assert [t.id for t in taken] == jobs[:1] and taken[0].want == {"": "r1"}
    assert [t.id for t in new.take("w2", 8)] == jobs[1:2]  # the swap is recorded: no need to name it again


# ---------------------------------------------------------------- item 2: the result-bytes counter


def _counted(client) -> int:
    (key,) = client.keys("t:*:bytes") or [b"none"]
    return int(client.get(key) or 0)


def _held(client) -> int:
    return sum(int(client.hget(k, "size") or 0) for k in client.keys("t:*:job:*"))


def _ttls_pass(client) -> None:
    """What Redis does by itself once the TTLs of keys pass (here at once, not 61 s later): those keys are gone."""
    for k in client.keys("t:*"):
        if client.pttl(k) > 0:
            client.pexpire(k, 1)
    time.sleep(0.01)


def test_the_result_byte_counter_is_the_bytes_held_across_expiry_restart_and_deaths(redis):
    client = redis.client()
    s = store(redis, ttl_s=0.3, max_result_bytes=1000, lease_s=0.2)
    s.bind("rev")
    result = {"status": "done", "pad": "x" * 200}  # about 230 bytes: 4 fit under 1000

    def finish(n):
        ids = []
        for _ in range(n):
            jid = queue(s)
            (t,) = s.take("w", 1)
            assert s.finish(t.id, result) == 1
            ids.append(jid)
        return ids

    for _ in range(3):  # results expire unfetched (--job-ttl-s), and Redis' own TTLs pass
        finish(3)
        assert _counted(client) == _held(client) > 0
        time.sleep(0.35)
        _ttls_pass(client)
        s.stats()  # the store drops what expired
        assert _counted(client) == _held(client) == 0, f"{_counted(client)} bytes counted, {_held(client)} held"
    assert all(client.ttl(k) == -1 for k in client.keys("t:*"))  # Redis drops none of the store's keys by itself
    kept = finish(2)  # room for both: neither is evicted for phantom bytes
    assert all(s.get(j)["result"] == result and not s.get(j).get("evicted") for j in kept)
    dead = queue(s)  # a replica dies holding a job: another finishes it, the dead one's late result is a duplicate
    assert [t.id for t in s.take("dead", 1)] == [dead]
    time.sleep(0.25)
    assert [t.id for t in s.take("alive", 1)] == [dead]
    assert s.finish(dead, result) == 1 and s.finish(dead, result) == 0
    assert _counted(client) == _held(client) == 3 * len(json.dumps(result))
    redis.stop()
    redis.start()  # no persistence: everything is gone, the counter too
    assert _counted(client) == _held(client) == 0
    finish(1)
    assert _counted(client) == _held(client) == len(json.dumps(result))


# ---------------------------------------------------------------- item 4: only the weights asked for


def test_a_server_with_other_weights_and_the_same_recorded_revision_scores_none_of_anothers_jobs(bundles, models, expected, redis):
    rev_a = manifest_sha256(bundles["a"])
    assert models["a"].revision == models["b"].revision  # what the keys used to follow
    with InProcessServer(models["a"], job_store=redis.url, replica_id="a") as a, \
            InProcessServer(models["b"], job_store=redis.url, replica_id="b") as b:
        jobs = [a.client().submit_group("p", CTX, CANDS) for _ in range(16)]
        answers = [wait(lambda j=j: b.get(f"/v1/jobs/{j.id}")) for j in jobs]  # fetched from either: the answer is a's
        revisions = [{row["model_revision"] for row in r.json()["results"]} for r in answers]
        assert revisions == [{rev_a}] * 16, f"{sum(rev_a not in r for r in revisions)} of 16 jobs answered by other weights"
        assert all([row["reward"] for row in r.json()["results"]] == expected[rev_a] for r in answers)


def test_a_job_no_replica_serves_fails_with_the_reason_after_the_bound(redis):
    """The bound is --job-ttl-s (here 0.4 s) of waiting while no live replica serves what the job asked for."""
    gone, other = store(redis, ttl_s=0.4, lease_s=0.1), store(redis, ttl_s=0.4)
    gone.bind("r1")
    other.bind("r2")
    jid = queue(gone)
    time.sleep(0.45)
    gone.renew([])  # the replica serving r1 is alive (for 3 of its leases): its job waits for it
    assert other.take("w", 4) == [] and other.get(jid)["state"] == "queued"
    time.sleep(0.35)  # it died: no sign of life since
    assert other.take("w", 4) == []
    job = other.get(jid)
    assert job["state"] == "done" and "no replica serves revision r1" in job["failed"] and "\n" not in job["failed"], job


# ---------------------------------------------------------------- item 5: a poison job


def test_a_job_that_kills_every_replica_taking_it_fails_after_a_bounded_number_of_deaths(redis, model):
    s = store(redis, namespace="nvrm", lease_s=0.2)  # --job-attempts' default: 3
    s.bind(model.revision)
    v1, cosmos = queue(s), queue(s, "cosmos", {"prompts": 2})
    handed = {v1: 0, cosmos: 0}
    for i in range(12):  # each replica that takes them dies (never renews, never finishes)
        for t in s.take(f"replica-{i}", 4):
            handed[t.id] += 1
        time.sleep(0.25)
    assert handed == {v1: 3, cosmos: 3}, f"handed out {handed} times (12 replicas died)"
    with InProcessServer(model, job_store=redis.url) as server:
        r = server.get(f"/v1/jobs/{v1}")
        assert r.status_code == 200 and r.json()["status"] == "failed", r.text
        message = r.json()["error"]["message"]
        assert "died" in message and "3 times" in message and "\n" not in message, message
        p = server.post("/api/reward/pull", data={"uuid": cosmos, "type": "nvrm"})
        assert p.status_code == 200 and p.json()["failed"] == [0, 1], p.text
        assert all("3 times" in e["error"] for e in p.json()["errors"])


# ---------------------------------------------------------------- item 6: the password


def test_the_redis_password_is_in_no_answer_log_line_or_metric(redis, model, caplog, capsys):
    from nvrm.cli.main import main
    from nvrm.serve.config import ServeConfig

    secret = "Round5-s3cret-pw"
    redis.client().config_set("requirepass", secret)
    url = f"{redis.url}?password={secret}"  # redis-py takes it
    caplog.set_level(logging.DEBUG)
    with InProcessServer(model, job_store=url) as s:
        jid = s.post("/v1/jobs/score", json=JOB).json()["id"]
        assert wait(lambda: s.get(f"/v1/jobs/{jid}")).json()["status"] == "done"
        redis.stop()
        answers = [s.post("/v1/jobs/score", json=JOB), s.get(f"/v1/jobs/{jid}"), s.get("/api/reward/ping"),
                   s.post("/api/reward/pull", data={"uuid": jid})]
        for r in answers:
            assert r.status_code == 503 and secret not in r.text and "***" in r.text, r.text
        time.sleep(1.5)  # the queue worker logs the outage
        for path in ("/metrics", "/v1/info"):
            assert secret not in s.get(path).text
    assert secret not in caplog.text and "unavailable" in caplog.text
    dead = f"redis://127.0.0.1:{free_port()}/0?password={secret}"
    assert main(["serve", "--model", "demo", "--job-store", dead, "--port", str(free_port())]) == 2
    out = capsys.readouterr()
    assert secret not in out.err + out.out and len(out.err.strip().splitlines()) == 1, out.err
    assert secret not in repr(ServeConfig(job_store=url))


# ---------------------------------------------------------------- item 7: a Redis that evicts


def test_a_redis_that_may_evict_any_key_is_refused_at_start_and_its_jobs_at_run_time(tmp_path, model, capsys):
    from nvrm.cli.main import main

    with RedisServer(tmp_path / "lru", "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru") as lru:
        with pytest.raises(ConfigError) as e:
            InProcessServer(model, job_store=lru.url)
        assert "allkeys-lru" in str(e.value) and "noeviction" in str(e.value) and "\n" not in str(e.value)
        assert main(["serve", "--model", "demo", "--job-store", lru.url, "--port", str(free_port())]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "maxmemory-policy" in err[0], err
    with RedisServer(tmp_path / "ok", "--maxmemory", "3mb", "--maxmemory-policy", "noeviction") as ok, \
            InProcessServer(model, job_store=ok.url) as s:
        assert s.post("/v1/jobs/score", json=JOB).status_code == 200
        ok.client().config_set("maxmemory-policy", "allkeys-lfu")  # changed under the running service
        time.sleep(1.1)
        r = s.post("/v1/jobs/score", json=JOB)
        message = r.json()["error"]["message"]
        assert r.status_code == 503 and "allkeys-lfu" in message and "\n" not in message, r.text
        ok.client().config_set("maxmemory-policy", "volatile-lru")  # evicts only keys with a TTL: the store sets none
        time.sleep(1.1)
        assert s.post("/v1/jobs/score", json=JOB).status_code == 200
