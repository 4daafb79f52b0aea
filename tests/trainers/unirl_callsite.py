"""UniRL 0.2.0's own reward client against ``nvrm serve`` (run in the unirl overlay by test_http_reward_protocols.py).

    python unirl_callsite.py URL CONTEXT_PATH OUT_DIR

A group of 4 videos of one prompt (one context, named in each sample's metadata as UniRL carries
dataset fields) and one sample without a context go through ``RemoteRewardBackend.compute_rewards``
unchanged. The mp4 bytes the client actually sent are written to OUT_DIR (the test scores the
same bytes in process), with the backend's answer in result.json.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import torch
from unirl.reward.remote import RemoteRewardBackend, RemoteRewardSpec
from unirl.types.primitives import Texts, Video, Videos
from unirl.types.reward import RewardRequest

PROMPT = "A square glides across a tiled floor."


def videos(n: int) -> list[Video]:
    """n distinct smooth videos [T, C, H, W] in [0, 1]: 44 frames, 5.5 s at the client's 8 FPS."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        coarse = torch.rand(44, 3, 4, 4, generator=g)
        out.append(Video(frames=torch.nn.functional.interpolate(coarse, size=(64, 64), mode="bilinear", align_corners=False).clamp(0, 1)))
    return out


def main(url: str, context: str, out: Path) -> None:
    spec = RemoteRewardSpec(base_url=url, required_rewards=("nvrm",), input_kind="video", video_fps=8)
    backend = RemoteRewardBackend(config=spec, base_device="cpu")
    sent: list[dict] = []
    post = backend._session.post

    def recording_post(target, json=None, **kw):  # observes what the client sends; the call is the client's own
        sent.append(json)
        return post(target, json=json, **kw)

    backend._session.post = recording_post
    available = backend.is_available()
    n = 5
    meta = [{"nvrm_context": {"path": context}, "policy_version": 3}] * 4 + [{"policy_version": 3}]
    request = RewardRequest(
        generated={"video": Videos.from_list(videos(n))},
        original_prompt=Texts(texts=[PROMPT] * n),
        generation_prompt=Texts(texts=[PROMPT] * n),
        metadata=meta,
        sample_ids=[f"s{i}" for i in range(n)],
        group_ids=["g0"] * 4 + ["g1"],
    )
    response = backend.compute_rewards(request)
    out.mkdir(parents=True, exist_ok=True)
    for i, item in enumerate(sent[-1]["requests"]):
        (out / f"video{i}.mp4").write_bytes(base64.b64decode(item["history"][-1]["video_b64"]))
    result = {"available": available, "rewards": response.rewards, "successes": response.successes, "errors": response.errors,
              "component": response.component_rewards, "posts": len(sent)}
    (out / "result.json").write_text(json.dumps(result))
    print("UNIRL_OK")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
