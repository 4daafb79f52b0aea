"""cosmos-rl's ``reward_fn`` names are served models (issue 39, item 2), in process.

``{"nvrm": 1.0, "mine": 0.5}`` is scored by both models (``--model NAME=DIR``) on one decode of the
latents; ``pull`` with ``type=NAME`` answers that model's raw scores (weights are cosmos-rl's to apply,
as its own reward service leaves them). cosmos-rl's own client against two models:
``tests/trainers/test_cosmos_env.py``."""

import io
import json
import time

import numpy as np
import pytest

from nvrm import Clip, RewardModel
from nvrm.serve.models.served import NamedModels
from nvrm.serve.models.weights import manifest_sha256
from nvrm.synth.bundles import ArchSpec, build_tiny_bundle
from helpers import InProcessServer



def body_of(meta: dict, array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return json.dumps(meta).encode() + b"\n" + buf.getvalue()


def pulled(s, uid: str, kind: str | None, timeout: float = 120):
    deadline = time.time() + timeout
    while True:
        r = s.post("/api/reward/pull", data={"uuid": uid, **({"type": kind} if kind is not None else {})})
        if r.status_code != 425 or time.time() > deadline:
            return r
        time.sleep(0.05)


@pytest.fixture(scope="module")
def two(tiny_bundle, tmp_path_factory):
    mine = build_tiny_bundle(tmp_path_factory.mktemp("mine") / "mine", ArchSpec(seed=7))
    ms = {"nvrm": RewardModel.from_pretrained(tiny_bundle, device="cpu"), "mine": RewardModel.from_pretrained(mine, device="cpu")}
    yield ms
    for m in ms.values():
        m.close()


@pytest.fixture(scope="module")
def served(two, tiny_bundle, vae):
    specs = [("nvrm", str(tiny_bundle)), ("mine", str(two["mine"].path))]
    s = InProcessServer(NamedModels(specs, lambda where: RewardModel.from_pretrained(where, device="cpu")), max_wait_ms=10,
                        latent_decoder=str(vae))
    deadline = time.time() + 60
    while s.get("/readyz").status_code != 200 and time.time() < deadline:
        time.sleep(0.05)
    yield s
    s.stop()


def test_reward_fn_names_two_models_scored_on_one_decode(served, two, vae, monkeypatch):
    from nvrm.serve.protocols.cosmos.decode_workers import DecodeWorker
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    decodes = []  # the requests' latents sent to the decode workers (the server's CPU decodes are theirs)
    real = DecodeWorker.decode_batch
    monkeypatch.setattr(DecodeWorker, "decode_batch", lambda self, requests: decodes.extend(requests) or real(self, requests))
    rng = np.random.default_rng(3)
    z = rng.standard_normal((2, 16, 21, 4, 6)).astype(np.float16)
    z[:, :, :1] = z[:1, :, :1]  # one conditioning frame: one context for the prompt's rollouts
    r = served.post("/api/reward/enqueue", content=body_of({"prompts": ["p"] * 2, "reward_fn": {"nvrm": 1.0, "mine": 0.5}}, z))
    assert r.status_code == 200, r.text
    uid = r.json()["uuid"]
    answers = {kind: pulled(served, uid, kind) for kind in ("nvrm", "mine", None)}
    assert all(a.status_code == 200 for a in answers.values()), {k: a.text for k, a in answers.items()}
    assert len(decodes) == 1  # one decode served both models

    frames = LatentDecoder(vae, "cpu").decode(z)[0]
    for kind in ("nvrm", "mine"):
        body = answers[kind].json()
        m = two[kind]
        want = [x.reward for x in m.score_group("p", Clip(frames[0][:1], 16.0), [Clip(f[1:], 16.0) for f in frames])]
        assert body["scores"]["reward"] == want, kind  # raw, bit for bit: the weight is cosmos-rl's to apply
        assert body["type"] == kind and body["input_info"]["model"] == kind
        assert body["input_info"]["model_revision"] == manifest_sha256(m.path)
    assert answers["nvrm"].json()["scores"] != answers["mine"].json()["scores"]
    assert answers[None].json()["scores"] == answers["nvrm"].json()["scores"]  # no type: the first name


def test_pull_of_a_name_not_served_or_not_asked_for_is_a_400(served):
    z = np.random.default_rng(4).integers(0, 255, (1, 82, 32, 48, 3), dtype=np.uint8)  # pixels: nothing to decode
    r = served.post("/api/reward/enqueue", content=body_of({"prompts": ["p"], "reward_fn": {"mine": 1.0}, "media_type": "video"}, z))
    assert r.status_code == 200, r.text
    uid = r.json()["uuid"]
    assert pulled(served, uid, "mine").status_code == 200
    other = pulled(served, uid, "nvrm")
    assert other.status_code == 400 and "reward_fn named mine" in other.json()["error"]["message"], other.text
    unknown = pulled(served, uid, "dance_grpo")
    message = unknown.json()["error"]["message"]
    assert unknown.status_code == 400 and "nvrm, mine" in message and "\n" not in message, unknown.text
    bad = served.post("/api/reward/enqueue", content=body_of({"prompts": ["p"], "reward_fn": {"nvrm": 1.0, "hpsv2": 1.0}, "media_type": "video"}, z))
    assert bad.status_code == 400 and "hpsv2" in bad.json()["error"]["message"] and "nvrm, mine" in bad.json()["error"]["message"]


def test_the_decode_workers_and_the_in_process_decode_give_one_reward(served, two, vae):
    """``--decode-workers 0`` (a thread of the server's own process) and the default (worker processes) score a
    prompt's B = 1 rollouts alike, and as ``score_group`` on ``LatentDecoder.decode``'s frames in process."""
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    z = np.random.default_rng(11).standard_normal((4, 16, 21, 4, 6)).astype(np.float16)
    z[:, :, :1] = z[:1, :, :1]
    frames = LatentDecoder(vae, "cpu").decode(z)[0]
    want = [x.reward for x in two["nvrm"].score_group("q", Clip(frames[0][:1], 16.0), [Clip(f[1:], 16.0) for f in frames])]
    inline = InProcessServer(two["nvrm"], max_wait_ms=10, latent_decoder=str(vae), decode_workers=0)
    try:
        got = {}
        for name, s in (("workers", served), ("in process", inline)):
            uids = [s.post("/api/reward/enqueue", content=body_of({"prompts": ["q"], "reward_fn": {"nvrm": 1.0}}, z[i : i + 1])).json()["uuid"]
                    for i in range(4)]  # one enqueue per rollout, as cosmos-rl's rollout workers send them
            got[name] = [pulled(s, uid, "nvrm").json()["scores"]["reward"][0] for uid in uids]
    finally:
        inline.stop()
    assert got["workers"] == want and got["in process"] == want, (got, want)
