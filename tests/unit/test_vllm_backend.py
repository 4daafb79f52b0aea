"""The vLLM backend's refusals and its hand-over, without vLLM (``nvrm.scoring.vllm_model``): vLLM not installed,
a head_dim its CPU kernels lack, ``exact=True``, ``differentiable()``; and a stand-in forward shows that vLLM would
receive nvrm's own frames and chat text, a group at a time, with every result marked ``backend="vllm"``."""

from __future__ import annotations

import sys
import types

import pytest

from nvrm import RewardModel
from nvrm.errors import BackendError, ConfigError
from nvrm.forward.vllm_backend import CPU_HEAD_SIZES, VllmScore, check_head_dim, head_overrides
from nvrm.scoring.vllm_model import VllmRewardModel, VllmScoreResult
from nvrm.settings import LoadSettings


class Recorder:
    """A stand-in for vLLM: records the requests and scores each by its number of frames."""

    def __init__(self):
        self.calls = []

    def classify(self, requests):
        self.calls.append(list(requests))
        return [VllmScore(float(len(r.images)) + k, 100 + k) for k, r in enumerate(requests)]


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module that imports and says it runs on the CPU (its ``LLM`` must never be reached)."""
    mod = types.ModuleType("vllm")
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True)
    mod.platforms = platforms
    mod.LLM = lambda *a, **k: pytest.fail("vLLM started despite a refusal")
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_missing_vllm_names_the_install_command(tiny_bundle, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, as where it is not installed
    with pytest.raises(BackendError) as e:
        RewardModel.from_pretrained(tiny_bundle, backend="vllm")
    assert "pip install 'nvrm[vllm]'" in one_line(e)


def test_a_head_dim_the_cpu_kernels_lack_is_one_line(tiny_bundle, fake_vllm):
    with pytest.raises(BackendError) as e:  # the tiny bundle's head_dim is 16
        RewardModel.from_pretrained(tiny_bundle, backend="vllm")
    assert "head_dim=16" in one_line(e) and "32, 64, 80" in str(e.value)
    for ok in CPU_HEAD_SIZES:
        check_head_dim(types.SimpleNamespace(text_config=types.SimpleNamespace(head_dim=ok)), on_cpu=True)
    check_head_dim(types.SimpleNamespace(text_config=types.SimpleNamespace(head_dim=16)), on_cpu=False)  # GPU kernels are vLLM's to judge


def test_exact_is_refused(tiny_bundle, fake_vllm):
    with pytest.raises(BackendError) as e:
        RewardModel.from_pretrained(tiny_bundle, backend="vllm", exact=True)
    assert "never exact" in one_line(e)


def test_an_unknown_backend_is_refused(tiny_bundle):
    with pytest.raises(ConfigError, match="backend='sglang' must be one of nvrm, vllm"):
        RewardModel.from_pretrained(tiny_bundle, backend="sglang")


@pytest.fixture(scope="module")
def recorded(tiny_bundle):
    forward = Recorder()
    rm = VllmRewardModel.load(tiny_bundle, LoadSettings(workers=0), forward=forward)  # the bundle exported on the fly
    yield rm, forward
    rm.close()


def test_vllm_gets_nvrms_frames_and_text_a_group_at_a_time(recorded, model, clips):
    from nvrm.engine.chat import render

    rm, forward = recorded
    forward.calls.clear()
    cands = [clips["cand_a"], clips["cand_b"]]
    results = rm.score_group("a prompt", clips["context"], cands)
    assert len(forward.calls) == 1 and len(forward.calls[0]) == 2  # the group went as one
    for request, cand in zip(forward.calls[0], cands):
        item = model.prepare("a prompt", clips["context"], cand)
        frames = [*item.context.images, *item.candidate.images]
        assert [im.tobytes() for im in request.images] == [im.tobytes() for im in frames]
        assert request.text == render(model.processor, "a prompt", len(item.context.images), len(item.candidate.images), model.contract)
    for k, r in enumerate(results):
        assert isinstance(r, VllmScoreResult) and r.backend == "vllm" and r.exact is False
        assert r.to_dict()["backend"] == "vllm" and r.num_tokens == 100 + k
    assert results[0].contract == model.fingerprint  # the export's preprocessing is the bundle's


def test_exact_and_gradients_are_refused_per_call(recorded, clips):
    rm, _ = recorded
    with pytest.raises(BackendError, match="never exact"):
        rm.score_group("p", clips["context"], [clips["cand_a"]], exact=True)
    with pytest.raises(BackendError, match="never exact"):
        rm.score_batch([("p", clips["context"], clips["cand_a"])], exact=True)
    with pytest.raises(BackendError) as e:
        rm.differentiable()
    assert "differentiable reward runs on nvrm's engine" in one_line(e)


def test_a_bad_candidate_fails_its_slot_only(recorded, clips):
    rm, forward = recorded
    out = rm.score_group("p", clips["context"], [clips["cand_a"], clips["short"]], errors="return")
    assert isinstance(out[0], VllmScoreResult) and not isinstance(out[1], VllmScoreResult)
    [[a], [b]] = list(rm.score_groups([("p", clips["context"], [clips["cand_a"]]), ("p", "missing.mp4", [clips["cand_a"]])]))
    assert isinstance(a, VllmScoreResult) and not isinstance(b, VllmScoreResult)


def test_the_head_runs_as_the_run_asks():
    assert head_overrides("float32", "float32") == {"architectures": ["Qwen3VLForSequenceClassification"], "num_labels": 1}
    assert head_overrides("bfloat16", "bfloat16")["head_dtype"] == "model"  # the release's bf16 logit


# ---------------------------------------------------------------- --vllm-url: a vLLM server someone else runs (a stand-in server)


def _server(served: str, *, fail: bool = False):
    """An httpx client whose transport answers as a vLLM pooling server serving ``served`` (or drops ``/classify``)."""
    import httpx

    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": served, "root": "/elsewhere"}]})
        if fail:
            raise httpx.ConnectError("connection refused")
        body = __import__("json").loads(request.content)
        seen.append(body)
        return httpx.Response(200, json={"data": [{"index": 0, "label": "reward", "probs": [0.25], "num_classes": 1}],
                                         "usage": {"prompt_tokens": 321, "total_tokens": 321}})

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


@pytest.fixture(scope="module")
def export_dir(recorded):
    return recorded[0].path


def _http(export_dir, client):
    from nvrm.forward.vllm_backend import HttpVllm

    return HttpVllm("http://vllm.test", export_dir, bounds={"min_pixels": 1, "max_pixels": 2}, chat_kwargs={}, client=client)


def test_a_server_for_another_model_is_refused(export_dir):
    from nvrm.forward.vllm_backend import served_name

    client, _ = _server("someone-elses-model")
    with pytest.raises(BackendError) as e:
        _http(export_dir, client)
    name = served_name(__import__("json").loads((export_dir / "config.json").read_text()))
    assert f"--served-model-name {name}" in one_line(e) and "someone-elses-model" in str(e.value)


def test_the_server_gets_nvrms_frames_as_chat_parts(recorded, export_dir, clips):
    import base64
    import io

    from PIL import Image

    from nvrm.forward.vllm_backend import served_name

    rm, _ = recorded
    client, seen = _server(served_name(__import__("json").loads((export_dir / "config.json").read_text())))
    http = _http(export_dir, client)
    old, rm.forward = rm.forward, http
    try:
        [r] = rm.score_group("a prompt", clips["context"], [clips["cand_a"]])
    finally:
        rm.forward = old
    assert (r.reward, r.num_tokens, r.backend) == (0.25, 321, "vllm")
    [body] = seen
    assert body["add_generation_prompt"] is True and body["use_activation"] is False and body["mm_processor_kwargs"]
    urls = [p["image_url"]["url"] for p in body["messages"][0]["content"] if p["type"] == "image_url"]
    prepared = rm.engine.prepare(clips["context"], "context").images + rm.engine.prepare(clips["cand_a"], "candidate").images
    assert len(urls) == len(prepared)
    got = Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1])))
    assert got.tobytes() == prepared[0].tobytes()  # lossless: the server sees nvrm's JPEG-round-tripped pixels


def test_a_server_that_dies_is_a_503_with_a_reason(recorded, export_dir, clips):
    from nvrm.errors import Unavailable
    from nvrm.forward.vllm_backend import served_name

    rm, _ = recorded
    client, _ = _server(served_name(__import__("json").loads((export_dir / "config.json").read_text())), fail=True)
    old, rm.forward = rm.forward, _http(export_dir, client)
    try:
        with pytest.raises(Unavailable) as e:
            rm.score_group("a prompt", clips["context"], [clips["cand_a"]])
        out = rm.score_group("a prompt", clips["context"], [clips["cand_a"]], errors="return")
    finally:
        rm.forward = old
    assert e.value.status == 503 and "did not answer" in one_line(e) and "connection refused" in str(e.value)
    assert isinstance(out[0], Unavailable)


def test_backend_parity_ranks_and_drift_are_computed_as_stated():
    from nvrm.bench.backend_parity import compare, kendall_tau

    assert kendall_tau([1, 2, 3], [1, 2, 3]) == (1.0, 1.0)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == (-1.0, 0.0)
    tau, alike = kendall_tau([1, 2, 3, 4], [1, 3, 2, 4])  # one of six pairs swapped
    assert tau == pytest.approx(4 / 6) and alike == pytest.approx(5 / 6)
    assert kendall_tau([1, 1], [1, 2]) == (0.0, 0.0)  # a tie is not an agreement
    assert kendall_tau([5.0], [7.0]) == (1.0, 1.0)
    out = compare([[1.0, 2.0], [4.0, -2.0]], [[1.5, 2.0], [4.0, -1.0]])
    assert out["max_abs_diff"] == 1.0 and out["max_rel_diff"] == 0.5 and out["candidates"] == 4
    assert out["kendall_tau"] == [1.0, 1.0] and out["min_pairs_alike"] == 1.0
    with pytest.raises(ValueError):
        compare([[1.0, 2.0]], [[1.0]])


def test_an_in_process_engine_that_dies_is_a_503_then_restarts(monkeypatch):
    """vLLM's engine failing mid-request: every slot a 503 with the reason, and the next request starts a new engine."""
    from nvrm.errors import BackendUnavailable
    from nvrm.forward.vllm_backend import InProcessVllm, VllmRequest

    started = []

    class LLM:
        def __init__(self, export, **kwargs):
            started.append(self)
            self.calls = 0

        def classify(self, prompts, **kwargs):
            self.calls += 1
            if len(started) == 1:
                raise RuntimeError("EngineDeadError: the engine core died")
            return [types.SimpleNamespace(outputs=types.SimpleNamespace(probs=[0.5 + k]), prompt_token_ids=[1, 2, 3], num_cached_tokens=k)
                    for k, _ in enumerate(prompts)]

    mod = types.ModuleType("vllm")
    mod.LLM, mod.PoolingParams = LLM, lambda **kw: kw
    mod.platforms = types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda: True))
    monkeypatch.setitem(sys.modules, "vllm", mod)
    engine = InProcessVllm("/nowhere", dtype="float32", head_dtype="float32", bounds={}, max_images=2)
    reqs = [VllmRequest("text", ()), VllmRequest("text", ())]
    with pytest.raises(BackendUnavailable) as e:
        engine.classify(reqs)
    assert e.value.status == 503 and e.value.code == "backend_unavailable" and "engine core died" in one_line(e)
    assert engine.llm is None
    scores = engine.classify(reqs)  # a new engine
    assert len(started) == 2 and [s.reward for s in scores] == [0.5, 0.5] and engine.llm is started[1]
