"""Issue 54 ("Hostile inputs, round 5") against the service and the RL adapter: safetensors bodies that looked like
pickles, bodies that raised past the routes (500s), NumPy float pixels on verl-omni's path, and a vLLM server that hangs
(a loopback stand-in for vLLM's HTTP protocol that holds one request: the real engine cannot be made to hang on demand)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from helpers import InProcessServer, free_port
from nvrm import Clip, RewardModel
from nvrm.errors import RewardFnError
from nvrm.serve.models.model_swap import ADMIN_HEADER
from nvrm.synth.clips import moving_square

KEY = "round5-admin"
PROMPT = "A square glides across a tiled floor."


@pytest.fixture(scope="module")
def served(model, clips):
    with InProcessServer(model, allow_dirs=(str(clips["context"].parent),), admin_key=KEY, max_wait_ms=2) as s:
        yield s


def no_traceback(r) -> str:
    """The error message of an answer: JSON, one line."""
    message = r.json()["error"]["message"]
    assert "\n" not in message and "Traceback" not in message, message
    return message


# ---------------------------------------------------------------- item 3: /drm/score and header lengths ending in 0x80


def drm_body(header_len: int, fps: str) -> bytes:
    """A valid safetensors body (candidate frames, a context path) whose JSON header is exactly ``header_len`` bytes."""
    frames = np.zeros((1, 2, 8, 8, 3), np.uint8)
    header = json.dumps({"frames": {"dtype": "U8", "shape": list(frames.shape), "data_offsets": [0, frames.size]},
                         "__metadata__": {"prompt": PROMPT, "fps": fps, "context_path": "context.mp4"}}).encode()
    return header_len.to_bytes(8, "little") + header + b" " * (header_len - len(header)) + frames.tobytes()


def test_no_safetensors_body_is_refused_as_a_pickle_whatever_its_header_length(served):
    """Every header length mod 256 reaches the safetensors parser (here to a 400 on its fps), never the pickle 415."""
    for n in range(512, 768):
        r = served.post("/drm/score", content=drm_body(n, "fast"), headers={"x-drm-protocol-version": "1"})
        assert r.status_code == 400, (n, r.status_code, r.text)
        assert "'fps'" in no_traceback(r) and "pickle" not in r.text


def test_a_body_written_as_verl_omni_writes_it_is_scored_when_its_header_length_ends_in_0x80(served, model):
    from safetensors.torch import save

    context = moving_square(8, 64, 96, seed=7)
    candidate = moving_square(20, 64, 96, seed=43, speed=4)
    tensors = {"frames": torch.from_numpy(candidate[None].copy()), "context": torch.from_numpy(context[None].copy())}
    bodies = {k: save(tensors, metadata={"prompt": PROMPT[:1] * k, "fps": "4"}) for k in range(150, 420)}
    hits = [k for k, b in bodies.items() if b[0] == 0x80]
    assert len(hits) >= 8  # a whole run of prompt lengths, refused with 415 before
    for k in (hits[0], hits[-1]):
        r = served.post("/drm/score", content=bodies[k], headers={"x-drm-protocol-version": "1"})
        assert r.status_code == 200, (k, r.text)
        want = model.score(PROMPT[:1] * k, Clip(context, 4.0), Clip(candidate, 4.0)).reward
        assert r.json()["raw_scores"] == [want]


def test_a_drm_header_integer_of_5000_digits_is_a_400(served):
    header = b'{"frames": {"dtype": "U8", "shape": [1, ' + b"7" * 5000 + b', 8, 8, 3], "data_offsets": [0, 3]}}'
    r = served.post("/drm/score", content=len(header).to_bytes(8, "little") + header + b"\0\0\0", headers={"x-drm-protocol-version": "1"})
    assert r.status_code == 400 and "thousands of digits" in no_traceback(r), r.text


# ---------------------------------------------------------------- 500s that are 400s


@pytest.mark.parametrize("wanted", [5, 2.5, "nvrm"])
def test_a_unirl_request_with_a_non_list_required_rewards_is_a_400(served, clips, wanted):
    req = {"history": [{"text": PROMPT, "video_path": str(clips["cand_a"])}], "required_rewards": wanted,
           "metadata": {"nvrm_context": {"path": str(clips["context"])}}}
    r = served.post("/unirl/score", json={"protocol_version": "1", "requests": [req]})
    assert r.status_code == 400, r.text
    assert "required_rewards" in no_traceback(r) and "required_rewards" in r.json()["errors"][0]["nvrm"]


@pytest.mark.parametrize("body, words", [
    (b"PATH_WITH_NUL", "NUL byte"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (json.dumps({"repo": "a/..", "revision": "main"}).encode(), "not a Hub repo id"),
    (json.dumps({"repo": "a/b..c", "revision": "main"}).encode(), "not a Hub repo id"),
])
def test_swap_bodies_that_raised_past_the_route_are_400s(served, clips, body, words):
    if body == b"PATH_WITH_NUL":
        body = json.dumps({"path": str(clips["context"].parent) + "/bundle\0v2"}).encode()
    before = served.get("/v1/models").json()
    r = served.http.put("/v1/models/nvrm", content=body, headers={"content-type": "application/json", ADMIN_HEADER: KEY})
    assert r.status_code == 400 and words in no_traceback(r), r.text
    assert served.get("/v1/models").json() == before


# ---------------------------------------------------------------- verl-omni: one rule for float pixels


def test_verl_omni_refuses_numpy_float_pixels_as_it_refuses_torch_floats(model, clips):
    from nvrm.rl import verl_omni_compute_score

    fn = verl_omni_compute_score(model, context_key="context_video", fps=4, coalesce_ms=0)
    info = {"context_video": str(clips["context"])}
    pixels = moving_square(21, 64, 96, seed=3).transpose(0, 3, 1, 2)  # [T, C, H, W], 5 s at 4 FPS
    assert fn(data_source="v", solution_image=torch.from_numpy(pixels.copy()), ground_truth=PROMPT, extra_info=info)["nvrm_ok"] == 1.0
    for floats in (pixels.astype(np.float32), pixels.astype(np.float64) / 255, torch.from_numpy(pixels.astype(np.float32))):
        with pytest.raises(RewardFnError, match=r"float tensor or array \(output_type: latent\?\)"):
            fn(data_source="v", solution_image=floats, ground_truth=PROMPT, extra_info=info)


# ---------------------------------------------------------------- item 9: a vLLM server that hangs

HANG = "hold this one, vLLM!"
"""A prompt the stand-in never answers (spaces and '!' cannot occur in the base64 of a frame)."""


class HangingVllm:
    """A loopback server speaking what nvrm uses of vLLM's protocol (``/v1/models``, ``/classify``): a request whose prompt
    holds ``HANG`` is held until ``release`` is set (then dropped unanswered), every other one is answered at once."""

    def __init__(self, name: str):
        self.arrived, self.release, self.answered = threading.Event(), threading.Event(), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, body):
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": name, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                texts = [p.get("text", "") for m in body["messages"] for p in m["content"] if p.get("type") == "text"]
                if any(HANG in t for t in texts):
                    outer.arrived.set()
                    outer.release.wait(120)
                    return  # dropped: the connection closes with no answer
                outer.answered.append(time.monotonic())
                self._send({"data": [{"index": 0, "probs": [0.625], "num_classes": 1}], "usage": {"prompt_tokens": 100}})

        self.url = f"http://127.0.0.1:{free_port()}"
        self.http = ThreadingHTTPServer(("127.0.0.1", int(self.url.rsplit(":", 1)[1])), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self):
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def vllm_export(tiny_bundle, tmp_path_factory):
    from nvrm.cli.main import main

    out = tmp_path_factory.mktemp("round5-vllm") / "export"
    assert main(["export", "--vllm", str(tiny_bundle), str(out)]) == 0
    return out


def test_a_hung_vllm_call_is_a_503_in_its_timeout_and_holds_no_other_request(vllm_export, clips):
    from nvrm.forward.vllm_backend import served_name

    vllm = HangingVllm(served_name(json.loads((vllm_export / "config.json").read_text())))
    model = RewardModel.from_pretrained(vllm_export, backend="vllm", vllm_url=vllm.url, workers=0, vllm_timeout_s=6)
    server = InProcessServer(model, allow_dirs=(str(clips["context"].parent),), request_timeout_s=30, max_wait_ms=2)
    item = {"context": {"path": str(clips["context"])}, "candidate": {"path": str(clips["cand_a"])}}
    hung: dict = {}

    def post_hung():
        t0 = time.monotonic()
        hung["r"] = server.post("/v1/score", json={"items": [{**item, "prompt": HANG}]})
        hung["s"], hung["at"] = time.monotonic() - t0, time.monotonic()

    waiter = threading.Thread(target=post_hung)
    try:
        waiter.start()
        assert vllm.arrived.wait(30), "the held request never reached the stand-in"
        t0 = time.monotonic()
        r = server.post("/v1/score", json={"items": [{**item, "prompt": PROMPT}]})  # vLLM answers this one at once
        other_s, other_at = time.monotonic() - t0, time.monotonic()
        assert r.status_code == 200 and r.json()["results"][0]["reward"] == 0.625, r.text
        waiter.join(40)
        assert not waiter.is_alive()
        assert other_at < hung["at"] and other_s < 5, (other_s, hung["s"])  # answered while the hung call still waited
        h = hung["r"]
        assert h.status_code == 503, h.text
        message = no_traceback(h)
        assert h.json()["error"]["code"] == "backend_unavailable" and "--vllm-timeout-s" in message and "6 s" in message
        assert h.headers.get("retry-after") and 5 < hung["s"] < 20
        again = server.post("/v1/score", json={"items": [{**item, "prompt": PROMPT}]})  # the service is not stuck
        assert again.status_code == 200, again.text
    finally:
        vllm.stop()
        waiter.join(10)
        server.stop()
        model.close()
