"""Every scoring path's numbers on a set of bundles and clips, as one JSON document (run per transformers).

    python tests/versions/probe.py OUT.json CLIPS_DIR BUNDLE [BUNDLE ...]

``test_transformers_matrix`` runs it with the release profile (transformers 4.57.6, this project's
environment) and again with each other transformers on the same torch, and requires the documents
to be equal: rewards of ``score``, packed ``score_batch``, ``exact`` batches, prefix-KV
``score_group`` and the differentiable reward (value and gradient), and the tensors in between
(token ids, 3-D positions, pixel values, vision features). Floats are written exactly (JSON
round-trips a Python float), tensors as sha256 of their bytes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch


def sha(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def items(clips: Path):
    from nvrm import Clip
    from nvrm.synth.clips import moving_square

    return [
        ("A square glides across a tiled floor.", clips / "context.mp4", clips / "smooth.mp4"),
        ("A square glides across a tiled floor.", clips / "context.mp4", clips / "frozen.mp4"),
        ("A red square glides across a tiled floor.", Clip(moving_square(40, 96, 128, seed=1), fps=4), Clip(moving_square(24, 96, 128, seed=2), fps=4)),
        ("Straße bei Nacht — 夜の街 🚶", [moving_square(1, 144, 176, seed=3)[0]], Clip(moving_square(60, 144, 176, seed=4), fps=10)),
        ("A thin strip.", Clip(moving_square(12, 48, 200, seed=5), fps=2), Clip(moving_square(15, 90, 120, seed=6), fps=3)),
    ]


def model_numbers(model, clips: Path) -> dict:
    out: dict = {"fingerprint": model.fingerprint}
    its = items(clips)
    singles = []
    for prompt, ctx, cand in its:
        p = model.prepare(prompt, ctx, cand)
        enc = p.encoded
        with torch.inference_mode():
            feats, deep = model.vision(enc.pixel_values, enc.image_grid_thw)
        r = model.score(prompt, ctx, cand)
        singles.append(
            {
                "reward": r.reward,
                "num_tokens": r.num_tokens,
                "input_ids": sha(enc.input_ids),
                "positions": sha(enc.positions),
                "pixel_values": sha(enc.pixel_values),
                "vision_features": sha(feats),
                "deepstack": [sha(d) for d in deep],
            }
        )
    out["score"] = singles
    out["score_batch"] = [r.reward for r in model.score_batch(its)]
    out["score_batch_exact"] = [r.reward for r in model.score_batch(its, exact=True)]
    prompt, ctx = its[0][0], its[0][1]
    cands = [clips / "smooth.mp4", clips / "frozen.mp4", clips / "teleport.mp4", its[2][2], clips / "flicker.mp4", its[4][2]]
    out["score_group"] = [r.reward for r in model.score_group(prompt, ctx, cands)]
    out["score_groups"] = [[r.reward for r in rs] for rs in model.score_groups([(prompt, ctx, cands[:3]), (its[2][0], its[2][1], cands[2:])])]
    return out


def differentiable_numbers(model) -> dict:
    from nvrm import Clip
    from nvrm.synth.clips import moving_square

    ctx = Clip(moving_square(3, 64, 96, seed=1), fps=1)
    frames = np.stack([moving_square(12, 64, 96, seed=5 + i, speed=1 + i) for i in range(2)])
    x = (torch.from_numpy(frames).permute(0, 1, 4, 2, 3).float() / 255).requires_grad_()
    rewards = model.differentiable()("p", ctx, x, fps=2)
    (rewards * torch.tensor([1.0, -0.5])).sum().backward()
    return {"value": rewards.tolist(), "grad": sha(x.grad), "grad_abs_sum": float(x.grad.abs().sum())}


def main(argv: list[str]) -> int:
    import transformers

    from nvrm import Contract, RewardModel

    out_path, clips, bundles = Path(argv[0]), Path(argv[1]), [Path(b) for b in argv[2:]]
    doc: dict = {"transformers": transformers.__version__, "torch": torch.__version__, "bundles": {}}
    for b in bundles:
        with RewardModel.from_pretrained(b, device="cpu") as model:
            numbers = model_numbers(model, clips)
            numbers["differentiable"] = differentiable_numbers(model)
        with RewardModel.from_pretrained(b, device="cpu", dtype="float32", contract=Contract(head_dtype="float32")) as model32:
            numbers["differentiable_float32"] = differentiable_numbers(model32)
        doc["bundles"][b.name] = numbers
    out_path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
