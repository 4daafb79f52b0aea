"""``nvrm serve --backend vllm --vllm-url``: the service in front of a vLLM server, over a stand-in for vLLM's HTTP
protocol (``/v1/models``, ``/classify``). The real vLLM is exercised in tests/trainers/test_vllm_env.py; this file checks
what nvrm's service does around it, cheaply: what it sends (the contract's pixels, the generation prompt, the pixel
bounds), ``backend`` on every result, and a 503 with a reason when vLLM goes away, then recovery (the model-level
refusals, such as a server for another model, are in tests/unit/test_vllm_backend.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from helpers import InProcessServer, free_port
from nvrm import RewardModel
from nvrm.cli.main import main
from nvrm.engine.chat import images_kwargs
from nvrm.errors import BackendError, NvrmError
from nvrm.forward.vllm_backend import served_name

PROMPT = "A square glides across a tiled floor."


def stand_in_reward(urls: list[str]) -> float:
    """The stand-in's reward: a number fixed by the exact images it was sent (so a test can recompute it)."""
    return int(hashlib.sha256("".join(urls).encode()).hexdigest()[:6], 16) / 2**24 * 8 - 4


class StandIn:
    """A loopback HTTP server speaking the part of vLLM's protocol nvrm uses, serving ``name``; it records each /classify body."""

    def __init__(self, name: str, port: int | None = None):
        self.name, self.bodies = name, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": outer.name, "object": "model"}]} if self.path == "/v1/models" else {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.bodies.append(body)
                urls = [p["image_url"]["url"] for m in body["messages"] for p in m["content"] if p.get("type") == "image_url"]
                cached = 100 if len(outer.bodies) > 1 else 0
                self._send(200, {"data": [{"index": 0, "probs": [stand_in_reward(urls)], "num_classes": 1}],
                                 "usage": {"prompt_tokens": 1000 + len(urls), "prompt_tokens_details": {"cached_tokens": cached}}})

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def export(tiny_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm-service") / "export"
    assert main(["export", "--vllm", str(tiny_bundle), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from nvrm.synth.clips import moving_square, write_video

    folder = tmp_path_factory.mktemp("vllm-clips")
    ctx = write_video(folder / "context.mp4", moving_square(48, 64, 64, seed=1), 8)
    cands = [write_video(folder / f"c{k}.mp4", moving_square(48, 64, 64, seed=10 + k, speed=2.0 + k), 8) for k in range(3)]
    return ctx, cands


def _name(export) -> str:
    return served_name(json.loads((export / "config.json").read_text()))


def _png_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.mark.slow
def test_the_service_sends_vllm_nvrms_pixels_and_answers_503_while_vllm_is_away(export, clips, tiny_bundle):
    vllm = StandIn(_name(export))
    model = RewardModel.from_pretrained(export, backend="vllm", vllm_url=vllm.url, workers=0)
    server = InProcessServer(model, allow_dirs=(str(clips[0].parent),))
    try:
        client = server.client(retries=0)
        ctx, cands = clips
        results = client.score_group(PROMPT, ctx, cands)
        with RewardModel.from_pretrained(tiny_bundle, device="cpu", workers=0) as exact:  # nvrm's own preparation of the same items
            items = [exact.prepare(PROMPT, ctx, c) for c in cands]
        assert len(vllm.bodies) == len(cands)
        for body, item, r in zip(vllm.bodies, items, results):
            frames = [*item.context.images, *item.candidate.images]
            sent = [p["image_url"]["url"] for m in body["messages"] for p in m["content"] if p.get("type") == "image_url"]
            got = [np.asarray(Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1])))) for u in sent]
            assert len(got) == len(frames) and all(np.array_equal(g, np.asarray(f)) for g, f in zip(got, frames))  # the contract's pixels
            assert body["add_generation_prompt"] is True and body["use_activation"] is False
            assert body["mm_processor_kwargs"] == images_kwargs(model.contract)  # the contract's bounds: vLLM does not resize again
            assert r.reward == stand_in_reward([_png_url(f) for f in frames])
            assert r.backend == "vllm" and r.exact is False and r.num_tokens == 1000 + len(frames)
        assert [r.cached_tokens for r in results] == [0, 100, 100]
        assert results[0].model_revision == model.revision and model.revision == "tiny-test-0001"

        port = vllm.port
        vllm.stop()  # vLLM goes away: a 503 that says why, and the service stays up
        video = {"data": base64.b64encode(cands[0].read_bytes()).decode()}
        raw = server.post("/v1/score_group", json={"prompt": PROMPT, "context": {"data": base64.b64encode(ctx.read_bytes()).decode()},
                                                   "candidates": [video]})
        assert raw.status_code == 503, raw.text
        err = raw.json()["error"]
        assert err["code"] == "backend_unavailable" and "vLLM" in err["message"] and "did not answer" in err["message"]
        assert raw.headers.get("retry-after")
        assert server.get("/healthz").status_code == 200

        vllm = StandIn(_name(export), port=port)  # back: scored again, same reward for the same item
        again = client.score_group(PROMPT, ctx, cands[:1])
        assert again[0].reward == results[0].reward
    finally:
        server.stop()
        vllm.stop()
        model.close()


def test_exact_and_gradients_are_refused_on_the_vllm_backend(export, clips):
    vllm = StandIn(_name(export))
    model = RewardModel.from_pretrained(export, backend="vllm", vllm_url=vllm.url, workers=0)
    server = InProcessServer(model, allow_dirs=(str(clips[0].parent),))
    try:
        ctx, cands = clips
        with pytest.raises(NvrmError, match="never exact"):
            model.score_group(PROMPT, ctx, cands, exact=True)
        out = server.client(retries=0).score_group(PROMPT, ctx, cands[:2], exact=True, errors="return")
        assert len(out) == 2 and all("never exact" in str(r) for r in out)
        assert vllm.bodies == []  # nothing reached vLLM
        with pytest.raises(BackendError, match="the differentiable reward runs on nvrm's engine"):
            model.differentiable()
    finally:
        server.stop()
        vllm.stop()
        model.close()


def test_vllm_url_needs_the_vllm_backend_and_ray_refuses_it(export, capsys):
    assert main(["serve", "--model", str(export), "--vllm-url", "http://127.0.0.1:9"]) == 2
    assert "--vllm-url http://127.0.0.1:9: needs --backend vllm" in capsys.readouterr().err
    assert main(["serve", "--model", str(export), "--backend", "vllm", "--ray"]) == 2
    assert "Ray Serve replicas run nvrm's engine" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_backend_parity_reports_speed_drift_and_the_prefix_check(tmp_path, capsys):
    """The harness end to end over the stand-in (its rewards are not the model's: this checks the report, not parity;
    the real vLLM's parity is measured in tests/trainers/test_vllm_env.py and BENCHMARKS.md)."""
    import hashlib

    from nvrm.bench.harness import build_bench_bundle

    bundle = build_bench_bundle("tiny")
    vllm = StandIn("nvrm-" + hashlib.sha256((bundle / "RELEASE_MANIFEST.json").read_bytes()).hexdigest()[:16])
    try:
        out = tmp_path / "parity.json"
        assert main(["bench", "--workload", "backend-parity", "--arch", "tiny", "--vllm-url", vllm.url, "--G", "3", "--n-groups", "2",
                     "--context-s", "1", "--size", "32x48", "--output", str(out)]) == 0
        table = capsys.readouterr().out
        report = json.loads(out.read_text())
        assert [(r["dtype"], r["G"], r["groups"]) for r in report["rows"]] == [("float32", 3, 2), ("bfloat16", 3, 2)]
        for r in report["rows"]:
            assert r["drift"]["candidates"] == 6 and len(r["drift"]["kendall_tau"]) == 2 and r["drift"]["max_abs_diff"] > 0
            assert r["prefix_cache"]["bit_identical_on_vs_off"] is True  # the stand-in's reward depends on the pixels only
            assert r["candidates_per_s"]["nvrm_exact"] > 0 and r["candidates_per_s"]["vllm"] > 0
        salts = [b.get("cache_salt") for b in vllm.bodies]
        assert any(salts) and not all(salts)  # the "off" pass salts every request, the "on" pass none
        assert "| float32 | 3 |" in table and "| bfloat16 | 3 |" in table
    finally:
        vllm.stop()
