"""The reward service's logic, with the app in process (``InProcessServer``: no port, no subprocess);
the tests that need a process (signals) start ``nvrm serve`` itself (``Server``)."""

import base64
import json
import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from nvrm import Clip, RewardFnError, make_reward_fn
from nvrm.client import RemoteItemError, RewardClient, ServiceError
from nvrm.protocol import encode_frames
from nvrm.synth.clips import moving_square
from helpers import GROUP_ULPS, InProcessServer, Server, bf16_ulp, in_threads, metric_sum


# small portrait frames keep each item cheap (~400 tokens) so many requests fit in CI time
CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)
CANDS = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(4)]




@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, clips):
    d = tmp_path_factory.mktemp("served")
    for k in ("context", "cand_a", "cand_b"):
        (d / clips[k].name).write_bytes(clips[k].read_bytes())
    outside = tmp_path_factory.mktemp("secret") / "secret.mp4"
    outside.write_bytes(clips["cand_a"].read_bytes())
    (d / "link.mp4").symlink_to(outside)
    return d, outside


@pytest.fixture(scope="module")
def server(model, data_dir):
    s = InProcessServer(model, allow_dirs=(str(data_dir[0]),), max_queue_items=64, max_body_mb=2, max_wait_ms=10)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def expected(model):
    return [model.score("p", CTX, c).reward for c in CANDS]


def post(server, path, body, headers=None):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return server.post(path, content=data, headers={"content-type": "application/json", **(headers or {})}, timeout=60)


def frames(clip):
    return {"frames": encode_frames(clip.numpy()), "fps": clip.fps}


def test_probes_info_and_metrics(server, model):
    assert server.get("/healthz").json() == {"status": "ok"}
    assert server.get("/readyz").json() == {"status": "ready"}
    info = server.get("/v1/info").json()
    assert info["model"]["revision"] == "tiny-test-0001" and info["contract"]["fingerprint"] == model.fingerprint
    assert info["limits"]["max_queue_items"] == 64 and info["limits"]["path_inputs"] is True
    text = server.get("/metrics").text
    for name in ("nvrm_requests_total", "nvrm_items_total", "nvrm_batch_size", "nvrm_items_admitted", "nvrm_request_seconds_bucket",
                 "nvrm_context_cache_total"):
        assert name in text


def test_concurrent_clients_get_every_answer_right_once(server, expected):
    """32 clients x 20 requests; each request carries two items in a client-specific order."""
    answers: dict[tuple[int, int], list[float]] = {}
    failures: list[str] = []

    def client(k):
        c = server.client(retries=50, backoff=0.05)
        for j in range(20):
            a, b = (k + j) % 4, (k + 2 * j + 1) % 4
            try:
                res = c.score_batch([("p", CTX, CANDS[a]), ("p", CTX, CANDS[b])])
            except Exception as e:  # noqa: BLE001
                failures.append(f"{k}/{j}: {e}")
                continue
            assert (k, j) not in answers
            answers[(k, j)] = [r.reward for r in res]
            for r, want in zip(res, (expected[a], expected[b])):
                if abs(r.reward - want) > GROUP_ULPS * bf16_ulp(want):
                    failures.append(f"{k}/{j}: got {r.reward}, in-process {want}")
        c.close()

    in_threads(client, 32)
    assert failures == []
    assert len(answers) == 32 * 20
    metrics = server.get("/metrics").text
    sizes = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("nvrm_batch_size_")}
    assert sizes["nvrm_batch_size_sum"] / sizes["nvrm_batch_size_count"] > 1.5, "requests were not batched together"


def test_group_endpoint_and_per_item_errors(server, data_dir, expected, model):
    d, _ = data_dir
    body = {
        "prompt": "p",
        "context": frames(CTX),
        "candidates": [frames(CANDS[0]), {"data": base64.b64encode(b"garbage" * 50).decode()}, frames(CANDS[2])],
    }
    r = post(server, "/v1/score_group", body)
    assert r.status_code == 200
    res = r.json()["results"]
    assert (abs(res[0]["reward"] - expected[0]) <= GROUP_ULPS * bf16_ulp(expected[0])
            and abs(res[2]["reward"] - expected[2]) <= GROUP_ULPS * bf16_ulp(expected[2]))
    assert res[1]["error"]["code"] == "invalid_input" and "not a readable video" in res[1]["error"]["message"]
    # a path inside the allowed dir, and encoded bytes of the same file, give the same reward
    ctx = {"path": str(d / "context.mp4")}
    by_path = post(server, "/v1/score", {"items": [{"prompt": "q", "context": ctx, "candidate": {"path": str(d / "cand_b.mp4")}}]})
    raw = base64.b64encode((d / "cand_b.mp4").read_bytes()).decode()
    by_data = post(server, "/v1/score", {"items": [{"prompt": "q", "context": ctx, "candidate": {"data": raw}}]})
    want = model.score("q", d / "context.mp4", d / "cand_b.mp4").reward
    assert by_path.json()["results"][0]["reward"] == by_data.json()["results"][0]["reward"]
    assert abs(by_path.json()["results"][0]["reward"] - want) <= GROUP_ULPS * bf16_ulp(want)
    # a short candidate is a contract violation; alone in its request -> 422 with the per-item body
    short = Clip(moving_square(3, 64, 32), fps=1)
    r = post(server, "/v1/score", {"items": [{"prompt": "p", "context": frames(CTX), "candidate": frames(short)}]})
    assert r.status_code == 422 and r.json()["results"][0]["error"]["code"] == "contract_violation"


@pytest.mark.parametrize(
    "body,status,needle",
    [
        (b"{not json", 400, "not valid JSON"),
        ({"items": "nope"}, 400, "request.items: must be a list"),
        ({"items": [{"prompt": 5, "context": {"path": "x"}, "candidate": {"path": "y"}}]}, 400, "request.items[0].prompt: must be a string"),
        ({"items": [{"prompt": "p", "context": {"data": "!!!notbase64"}, "candidate": {"data": "AAAA"}}]}, 400, "not valid base64"),
        ({"items": [{"prompt": "p", "context": {"frames": "AAAA", "fps": 1}, "candidate": {"data": "AAAA"}}]}, 400, "not a .npy array"),
        ({"items": [{"prompt": "p", "context": {"path": "/a", "data": "AAAA"}, "candidate": {"data": "AAAA"}}]}, 400, "exactly one of"),
        ({"items": [{"prompt": "p", "context": {"path": "/etc/passwd"}, "candidate": {"data": "AAAA"}}]}, 403, "outside the allowed directories"),
        ({"prompt": "p", "context": {"data": "AAAA"}, "candidates": []}, 400, "non-empty list"),
    ],
)
def test_malformed_requests_get_4xx_json_and_the_server_keeps_serving(server, body, status, needle):
    path = "/v1/score_group" if isinstance(body, dict) and "candidates" in body else "/v1/score"
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and "\n" not in err["message"] and "Traceback" not in r.text
    assert server.get("/healthz").status_code == 200


def test_paths_cannot_leave_the_allowed_dirs(server, data_dir):
    d, outside = data_dir
    for p in (d / ".." / outside.parent.name / outside.name, d / "link.mp4", Path(str(d) + "-evil") / "x.mp4"):
        r = post(server, "/v1/score", {"items": [{"prompt": "p", "context": {"path": str(p)}, "candidate": {"path": str(d / "cand_a.mp4")}}]})
        assert r.status_code == 403 and "outside the allowed directories" in r.json()["error"]["message"], p


def test_size_limits_and_unknown_routes(server):
    big = {"items": [{"prompt": "x" * (3 * 1024 * 1024), "context": {"data": "AAAA"}, "candidate": {"data": "AAAA"}}]}
    r = post(server, "/v1/score", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    many = {"prompt": "p", "context": frames(CTX), "candidates": [{"data": "AAAA"}] * 65}
    r = post(server, "/v1/score_group", many)
    assert r.status_code == 413 and "limit is 64" in r.json()["error"]["message"]
    assert server.get("/nope").json()["error"]["code"] == "not_found"
    assert server.get("/v1/score").status_code == 405


def test_backpressure_answers_503_with_retry_after(server):
    seen: list[int] = []
    retry_after: list[str] = []
    body = json.dumps({"prompt": "p", "context": frames(CTX), "candidates": [frames(c) for c in CANDS] * 2})

    def hit():
        r = server.post("/v1/score_group", content=body, headers={"content-type": "application/json"}, timeout=120)
        seen.append(r.status_code)
        if r.status_code == 503:
            retry_after.append(r.headers.get("retry-after"))

    in_threads(lambda _: hit(), 16)  # 16 x 8 items against a queue of 64
    assert set(seen) <= {200, 503} and 200 in seen and 503 in seen, seen
    assert all(ra == "1" for ra in retry_after)
    assert "nvrm_rejected_total{reason=\"queue_full\"}" in server.get("/metrics").text


def test_reward_fn_over_http_and_in_process(server, model, expected):
    fn = make_reward_fn(server.client())
    got = fn(["p"] * 4, [CTX] * 4, CANDS)  # one context: scored as a group
    assert all(abs(g - w) <= GROUP_ULPS * bf16_ulp(w) for g, w in zip(got, expected))
    local = make_reward_fn(model)
    assert all(abs(g - w) <= GROUP_ULPS * bf16_ulp(w) for g, w in zip(local(["p"] * 4, [CTX] * 4, CANDS), expected))
    bad = Clip(moving_square(2, 64, 32), fps=1)  # too short to be a candidate
    with pytest.raises(RewardFnError, match=r"1 of 3 item\(s\) failed: \[1\]"):
        fn(["p"] * 3, [CTX] * 3, [CANDS[0], bad, CANDS[1]])
    filled = make_reward_fn(server.client(), on_error="nan")(["p"] * 3, [CTX] * 3, [CANDS[0], bad, CANDS[1]])
    assert math.isnan(filled[1]) and not math.isnan(filled[0])


def test_async_client(server, expected):
    import asyncio

    async def go():
        c = server.client()
        res = await asyncio.gather(*(c.ascore_batch([("p", CTX, CANDS[i])]) for i in range(4)))
        group = await c.ascore_group("p", CTX, [CANDS[3], Clip(moving_square(2, 64, 32), fps=1)], errors="return")
        await c.aclose()
        return res, group

    res, group = asyncio.run(go())
    assert [r[0].reward for r in res] == pytest.approx(expected, abs=GROUP_ULPS * bf16_ulp(expected[0]))
    assert isinstance(group[1], RemoteItemError) and group[1].code == "contract_violation"


def test_auth_and_request_timeout(model):
    s = InProcessServer(model, api_key="s3cret", request_timeout_s=0.001)
    try:
        assert s.get("/healthz").status_code == 200  # probes stay open
        for path in ("/v1/info", "/metrics"):
            assert s.get(path).status_code == 401
            assert s.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        assert s.get("/v1/info", headers=good).status_code == 200
        body = {"items": [{"prompt": "p", "context": frames(CTX), "candidate": frames(CANDS[0])}]}
        assert post(s, "/v1/score", body).status_code == 401
        r = post(s, "/v1/score", body, headers=good)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        with pytest.raises(ServiceError, match="504"):
            s.client(api_key="s3cret", retries=1, backoff=0.01).score("p", CTX, CANDS[0])
    finally:
        s.stop()


def test_sigterm_drains_in_flight_requests(tiny_bundle, expected):
    s = Server(tiny_bundle, "--max-wait-ms", 50)
    results: list = []
    warm = threading.Barrier(7)

    def hit(i):
        c = RewardClient(s.url, retries=0)
        c.upload_context(CTX)  # now the scoring call is one POST, which SIGTERM must find in flight
        warm.wait(60)
        try:
            results.append(c.score_group("p", CTX, CANDS))
        except Exception as e:  # noqa: BLE001
            results.append(e)

    threads = [threading.Thread(target=hit, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    warm.wait(60)
    deadline = time.time() + 30
    while time.time() < deadline:  # until all six requests are admitted or answered (an answer leaves admission first)
        m = httpx.get(s.url + "/metrics").text
        answered = metric_sum(m, "nvrm_requests_total", endpoint="/v1/score_group", code="200")
        if metric_sum(m, "nvrm_items_admitted") + len(CANDS) * answered >= 6 * len(CANDS):
            break
        time.sleep(0.005)
    else:
        pytest.fail(f"the six requests were not all admitted within 30 s:\n{m}")
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(120)
    assert s.proc.wait(60) == 0
    assert len(results) == 6 and all(not isinstance(r, Exception) for r in results), results
    for r in results:
        assert [x.reward for x in r] == pytest.approx(expected, abs=GROUP_ULPS * bf16_ulp(expected[0]))
    assert "nvrm serve: stopped" in s.output()
    s.stop()


# ---------------------------------------------------------------- binary transport, shared contexts, docs


def test_binary_multipart_gives_the_json_answers(server, expected):
    json_client = server.client(transport="json")
    binary = server.client()  # multipart with raw .npy parts
    a = [r.reward for r in json_client.score_group("p", CTX, CANDS)]
    b = [r.reward for r in binary.score_group("p", CTX, CANDS)]
    assert a == b and all(abs(x - w) <= GROUP_ULPS * bf16_ulp(w) for x, w in zip(b, expected))
    # the documented curl form: a `request` part, and parts the VIDEO objects name
    from nvrm.protocol import npy_bytes

    request = {"prompt": "p", "context": {"part": "ctx", "fps": CTX.fps}, "candidates": [{"part": "c0", "fps": CANDS[0].fps}]}
    files = {"request": (None, json.dumps(request), "application/json"), "ctx": ("ctx.npy", npy_bytes(CTX.numpy())),
             "c0": ("c0.npy", npy_bytes(CANDS[0].numpy()))}
    r = server.post("/v1/score_group", files=files, timeout=60)
    assert r.status_code == 200 and r.json()["results"][0]["reward"] == b[0]
    bad = {"request": (None, json.dumps({**request, "candidates": [{"part": "nope", "fps": 1}]}), "application/json"),
           "ctx": ("ctx.npy", npy_bytes(CTX.numpy()))}
    r = server.post("/v1/score_group", files=bad, timeout=60)
    assert r.status_code == 400 and "names no part" in r.json()["error"]["message"]


def test_separate_requests_that_share_a_context_are_scored_together(model):
    s = InProcessServer(model, max_wait_ms=200)
    try:
        before = {k: v for k, v in _metric_values(s).items()}
        results = [None] * 8

        def hit(i):
            results[i] = s.client().score("shared", CTX, CANDS[i % 4]).reward

        in_threads(hit, 8)
        after = _metric_values(s)
        want = [model.score("shared", CTX, c).reward for c in CANDS]
        assert all(abs(r - want[i % 4]) <= GROUP_ULPS * bf16_ulp(want[i % 4]) for i, r in enumerate(results))
        hits = after.get('nvrm_context_cache_total{result="hit"}', 0) - before.get('nvrm_context_cache_total{result="hit"}', 0)
        assert hits >= 7  # one context prepared for eight requests
        assert after.get("nvrm_shared_context_items_total", 0) >= 2  # some of them scored as one group
    finally:
        s.stop()


def _metric_values(s) -> dict[str, float]:
    out = {}
    for line in s.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_openapi_docs_describe_the_protocol(server):
    spec = server.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert {"ScoreRequest", "GroupRequest", "Video", "ScoreResponse", "ErrorResponse"} <= set(schemas)
    body = spec["paths"]["/v1/score_group"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert server.get("/docs").status_code == 200


def test_the_client_imports_without_torch():
    code = (
        "import sys, time; t = time.perf_counter(); import nvrm.client; dt = time.perf_counter() - t; "
        "heavy = [m for m in ('torch', 'transformers', 'av', 'PIL') if m in sys.modules]; print(heavy, round(dt, 3))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    heavy, seconds = out.stdout.split("]")
    assert heavy == "[" and float(seconds) < 5, out.stdout + out.stderr


# ---------------------------------------------------------------- hostile requests (bounded work, 4xx answers)


@pytest.mark.parametrize(
    "raw,status,needle",
    [
        (b"[" * 200_000 + b"]" * 200_000, 400, "nested too deeply"),
        (b'{"items": [{"prompt": "p", "n": ' + b"9" * 5000 + b"}]}", 400, "not usable JSON"),
        (b"[" + b"{}," * 600_000 + b"{}]", 413, "more JSON objects"),
    ],
)
def test_hostile_json_is_refused_cheaply(server, raw, status, needle):
    r = server.post("/v1/score", content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    assert server.get("/healthz").status_code == 200


def test_an_npy_that_declares_terabytes_is_refused_from_its_header(server):
    import struct

    header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (100000, 8192, 8192, 3), }"
    header += b" " * (63 - len(header) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x00" * 64
    body = {"items": [{"prompt": "p", "context": {"frames": base64.b64encode(npy).decode(), "fps": 1}, "candidate": frames(CANDS[0])}]}
    r = post(server, "/v1/score", body)
    assert r.status_code == 400 and "max_source_pixels" in r.json()["error"]["message"]
    small = npy.replace(b"(100000, 8192, 8192, 3)", b"(100000, 64, 64, 3)      ")
    body["items"][0]["context"]["frames"] = base64.b64encode(small).decode()
    r = post(server, "/v1/score", body)
    assert r.status_code == 400 and "(1228800000 bytes) but carries" in r.json()["error"]["message"]


def test_a_megabyte_prompt_is_refused_and_others_keep_being_served(model, expected):
    s = InProcessServer(model, max_body_mb=8)
    try:
        body = {"items": [{"prompt": "word " * 200_000, "context": frames(CTX), "candidate": frames(CANDS[0])}]}
        r = post(s, "/v1/score", body)
        assert r.status_code == 422 and r.json()["results"][0]["error"]["code"] == "limit_exceeded"
        assert "max_prompt_tokens" in r.json()["results"][0]["error"]["message"]
        surrogate = json.dumps({"items": [{"prompt": "bad \ud800", "context": frames(CTX), "candidate": frames(CANDS[0])}]})
        r = s.post("/v1/score", content=surrogate, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 422 and "not valid Unicode" in r.json()["results"][0]["error"]["message"]
        slow = {"items": [{"prompt": "p", "context": {"frames": encode_frames(np.zeros((16, 8, 8, 3), np.uint8)), "fps": 1e-300},
                           "candidate": frames(CANDS[0])}]}
        assert "outside min_fps" in post(s, "/v1/score", slow).json()["error"]["message"]
        good = s.client().score("p", CTX, CANDS[1]).reward
        assert abs(good - expected[1]) <= GROUP_ULPS * bf16_ulp(expected[1])
    finally:
        s.stop()


def test_sigterm_during_long_work_answers_json_and_exits_zero(tiny_bundle):
    s = Server(tiny_bundle, "--drain-timeout-s", 1, "--workers", 1)
    answer: list = []

    def hit():
        big = [Clip(moving_square(5, 64, 32, seed=50 + i, speed=1 + i % 5), fps=1) for i in range(200)]
        body, payload = RewardClient(s.url, presample=False, context_refs=False)._group("p", CTX, big, False)
        answer.append(httpx.post(s.url + "/v1/score_group", timeout=120, **body.request(payload)))

    t = threading.Thread(target=hit)
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline and not any(v > 0 for k, v in _metric_values(s).items() if k == "nvrm_items_admitted"):
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert s.proc.wait(60) == 0, s.output()
    r = answer[0]
    assert r.headers["content-type"].startswith("application/json")
    # 200 candidates take far longer than the 1 s drain deadline: the open request is answered, 503
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text[:300]
    s.log.close()
