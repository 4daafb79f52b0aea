"""Issue 54 ("Hostile inputs, round 5"), the parts that need no model: telling a safetensors body from a pickle,
headers and swap bodies that used to raise past the routes (500s), and a vLLM server's answers read strictly, within a
size and a time bound (``HttpVllm`` over a stand-in transport)."""

from __future__ import annotations

import json
import pickle
import threading
import time
import types

import httpx
import numpy as np
import pytest

from nvrm.errors import BackendError, BackendUnavailable, InputError, RequestError
from nvrm.forward.vllm_backend import HttpVllm, VllmRequest
from nvrm.serve.protocols.drm import safetensors_header
from nvrm.serve.protocols.unirl import answer, pickled


def one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def safetensors_body(header_len: int, prompt: str = "p") -> bytes:
    """A valid safetensors body (one uint8 tensor) whose JSON header is exactly ``header_len`` bytes (space-padded)."""
    header = json.dumps({"frames": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                         "__metadata__": {"prompt": prompt, "fps": "4"}}).encode()
    assert len(header) <= header_len
    return header_len.to_bytes(8, "little") + header + b" " * (header_len - len(header)) + b"\x01\x02"


def test_a_safetensors_body_is_never_taken_for_a_pickle_whatever_its_header_length():
    """Item 3: a header length whose low byte is 0x80 (pickle's PROTO opcode) was refused as a pickle (415)."""
    lengths = range(256, 512)  # every header length mod 256, 0x80 among them
    for n in lengths:
        body = safetensors_body(n)
        assert not pickled(body), n
        tensors, meta, start = safetensors_header(body)
        assert start == 8 + n and meta["fps"] == "4" and tensors["frames"]["shape"] == [2]
    assert [n % 256 for n in lengths if safetensors_body(n)[0] == 0x80] == [0x80]
    for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):  # a real pickle is still refused, small or large
        for payload in ({"images": [], "prompts": ["p"]}, {"images": [b"\0" * 300_000]}):
            assert pickled(pickle.dumps(payload, protocol=proto)), proto


def test_safetensors_bodies_as_the_library_writes_them_are_not_pickles():
    """verl-omni's client writes with ``safetensors``, which pads the header to 8 bytes: whole prompt lengths hit 0x80."""
    from safetensors.numpy import save

    frames = np.zeros((1, 20, 8, 8, 3), np.uint8)
    hits = []
    for k in range(120, 400):
        body = save({"frames": frames}, metadata={"prompt": "x" * k, "fps": "4"})
        assert not pickled(body), k
        hits += [k] if body[0] == 0x80 else []
    assert len(hits) >= 8  # the lengths that were refused before


def test_a_header_integer_of_thousands_of_digits_is_a_400():
    header = b'{"frames": {"dtype": "U8", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 1]}}'
    body = len(header).to_bytes(8, "little") + header + b"\0"
    with pytest.raises(RequestError) as e:
        safetensors_header(body)
    assert e.value.status == 400 and "thousands of digits" in one_line(e.value)


@pytest.mark.parametrize("wanted", [5, 2.5, None, {"nvrm": 1}, "nvrm"])
def test_a_unirl_answer_for_a_request_with_a_non_list_required_rewards(wanted):
    req = {"history": [], "required_rewards": wanted}
    refused = {0: InputError("requests[0].required_rewards", "must name 'nvrm', the reward this server serves")}
    out = answer([req], [], [], refused, "fp")
    assert out["errors"] == [{"nvrm": "requests[0].required_rewards: must name 'nvrm', the reward this server serves"}]


# ---------------------------------------------------------------- PUT /v1/models/NAME bodies


def test_a_swap_body_nested_100k_deep_is_a_400():
    from nvrm.serve.models.model_swap import swap_body

    with pytest.raises(RequestError) as e:
        swap_body(b"[" * 100_000 + b"]" * 100_000)
    assert e.value.status == 400 and "nested too deeply" in one_line(e.value)


def test_a_swap_path_with_a_nul_byte_is_a_400(tmp_path):
    from nvrm.serve.models.model_swap import allowed_path

    serving = types.SimpleNamespace(config=types.SimpleNamespace(allow_dirs=(str(tmp_path),)))
    with pytest.raises(RequestError) as e:
        allowed_path(serving, {"path": str(tmp_path) + "/bundle\0x"})
    assert e.value.status == 400 and "NUL byte" in one_line(e.value)


@pytest.mark.parametrize("repo", ["a/..", "../b", "a/b/c", "a/-b", "a/b.", "a/b..c", "a/b--c", "a/" + "b" * 100, "a/b c", 7])
def test_a_swap_repo_that_is_no_hub_repo_id_is_a_400_before_any_download(repo, monkeypatch):
    import huggingface_hub

    from nvrm.serve.models.model_swap import from_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kw: pytest.fail("reached the Hub"))
    with pytest.raises(RequestError) as e:
        from_hub({"repo": repo, "revision": "main"})
    assert e.value.status == 400 and "is not a Hub repo id" in one_line(e.value)


def test_hub_repo_ids_the_hub_takes_pass():
    from nvrm.bundle.hub import repo_id_problem

    for ok in ("Efficient-Large-Model/WORL-NVRM", "worl/nvrm-retrained", "a/b", "org_1/model.v2"):
        assert repo_id_problem(ok) is None, ok


# ---------------------------------------------------------------- a vLLM server's answers (HttpVllm)

SERVED = "nvrm-" + "ab" * 8


@pytest.fixture()
def export_dir(tmp_path):
    """What HttpVllm reads of an export: config.json, naming the source manifest the served name comes from."""
    (tmp_path / "config.json").write_text(json.dumps({"nvrm_export": {"source_manifest_sha256": "ab" * 32}}))
    return tmp_path


def http_vllm(export_dir, classify, models=None, timeout_s: float = 5.0) -> HttpVllm:
    """HttpVllm over a transport whose /v1/models lists the export and whose /classify answers ``classify(request)``."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": SERVED}]} if models is None else models)
        return classify(request)

    client = httpx.Client(transport=httpx.MockTransport(handle))
    return HttpVllm("http://vllm.test", export_dir, bounds={}, chat_kwargs={}, timeout_s=timeout_s, client=client)


REQUEST = VllmRequest("text", (), ({"role": "user", "content": [{"type": "text", "text": "p"}]},))


def scored(probs, usage=None):
    return lambda _: httpx.Response(200, json={"data": [{"index": 0, "probs": probs, "num_classes": 1}],
                                               "usage": usage or {"prompt_tokens": 12}})


def test_a_well_formed_answer_is_the_score(export_dir):
    [s] = http_vllm(export_dir, scored([-1.5], {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 4}})).classify([REQUEST])
    assert (s.reward, s.num_tokens, s.cached_tokens) == (-1.5, 12, 4)


@pytest.mark.parametrize("answer_, words", [
    ({"data": [{"probs": "3.75"}], "usage": {"prompt_tokens": 1}}, "'probs' a string"),
    ({"data": [{"probs": [True]}], "usage": {"prompt_tokens": 1}}, "not a finite number"),
    ({"data": [{"probs": [0.5, 2.0]}], "usage": {"prompt_tokens": 1}}, "list of one number"),
    ({"data": [{"probs": ["1.0"]}], "usage": {"prompt_tokens": 1}}, "not a finite number"),
    ({"data": [{"probs": [0.5]}, {"probs": [0.7]}], "usage": {"prompt_tokens": 1}}, "must list one entry"),
    ({"data": [{"probs": [0.5]}], "usage": {"prompt_tokens": "12"}}, "not a count"),
    ({"data": [{"probs": [0.5]}], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": -1}}}, "not a count"),
    ([0.5], "without a score"),
])
def test_an_answer_that_is_not_one_score_is_a_503_not_a_reward(export_dir, answer_, words):
    vllm = http_vllm(export_dir, lambda _: httpx.Response(200, json=answer_))
    with pytest.raises(BackendUnavailable) as e:
        vllm.classify([REQUEST])
    assert e.value.status == 503 and words in one_line(e.value) and "vllm.test/classify" in str(e.value)


@pytest.mark.parametrize("models", [[{"id": SERVED}], {"data": {"id": SERVED}}, "vllm"])
def test_a_model_list_that_is_not_vllms_is_one_line_at_start(export_dir, models):
    with pytest.raises(BackendError) as e:
        http_vllm(export_dir, scored([0.0]), models=models)
    assert "not vLLM's model list" in one_line(e.value)


def test_a_huge_answer_is_refused_as_it_arrives(export_dir):
    from nvrm.forward.vllm_backend import MAX_ANSWER_BYTES

    sent = []

    def chunks():
        for _ in range(200):  # 200 MB, were it read whole
            sent.append(1)
            yield b" " * (1 << 20)

    vllm = http_vllm(export_dir, lambda _: httpx.Response(200, content=chunks(), headers={"content-type": "application/json"}))
    with pytest.raises(BackendUnavailable) as e:
        vllm.classify([REQUEST])
    assert f"more than {MAX_ANSWER_BYTES} bytes" in one_line(e.value)
    assert len(sent) <= MAX_ANSWER_BYTES // (1 << 20) + 2  # read no further than the bound


def test_a_server_that_hangs_is_a_503_within_the_timeout(export_dir):
    release = threading.Event()

    def hang(_):
        release.wait(30)
        return scored([0.0])(_)

    vllm = http_vllm(export_dir, hang, timeout_s=0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(BackendUnavailable) as e:
            vllm.classify([REQUEST])
        took = time.monotonic() - t0
    finally:
        release.set()
    assert took < 3 and e.value.status == 503
    assert "did not answer within 0.5 s (--vllm-timeout-s)" in one_line(e.value)


def test_the_timeout_is_a_setting_and_a_serve_flag():
    from nvrm.cli.main import build_parser
    from nvrm.cli.model_flags import settings_from_args
    from nvrm.errors import ConfigError
    from nvrm.settings import LoadSettings

    assert LoadSettings().vllm_timeout_s == 60.0
    args = build_parser().parse_args(["serve", "--model", "m", "--backend", "vllm", "--vllm-timeout-s", "7.5"])
    assert settings_from_args(args).vllm_timeout_s == 7.5
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="vllm_timeout_s"):
            LoadSettings(vllm_timeout_s=bad)
