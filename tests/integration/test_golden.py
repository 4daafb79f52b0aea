"""Checked-in golden values guard the whole pipeline against silent drift.

Regenerate (only after an intended change, and say why in the commit):
    NVRM_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_golden.py
"""

import hashlib
import json
import os
from pathlib import Path

import pytest

from nvrm import Clip
from nvrm.synth.clips import moving_square, write_video

GOLDEN = Path(__file__).parent.parent / "data" / "golden.json"


def _items(tmp: Path):
    h264 = write_video(tmp / "golden.mp4", moving_square(56, 120, 160, seed=31, speed=4), 8, options={"threads": "1"})
    return {
        "clips_4fps": ("A red square glides across a tiled floor.", Clip(moving_square(40, 96, 128, seed=1), fps=4), Clip(moving_square(24, 96, 128, seed=2), fps=4)),
        "one_frame_context_unicode": ("Straße bei Nacht — 夜の街 🚶", [moving_square(1, 144, 176, seed=3)[0]], Clip(moving_square(60, 144, 176, seed=4), fps=10)),
        "h264_file": ("A camera moves forward.", h264, h264),
    }


def _sha(t) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def _observe(model, items):
    out = {}
    for name, (prompt, ctx, cand) in items.items():
        p = model.prepare(prompt, ctx, cand)
        r = model.score(prompt, ctx, cand)
        out[name] = {
            "reward": r.reward,
            "num_tokens": r.num_tokens,
            "input_ids_sha256": _sha(p.encoded.input_ids),
            "pixel_values_sha256": _sha(p.encoded.pixel_values),
            "image_grid_thw": p.encoded.image_grid_thw.tolist(),
            "context_times": list(r.context_times),
            "candidate_times": list(r.candidate_times),
        }
    return {"contract": model.contract.fingerprint, "items": out}


def test_golden(model, tmp_path):
    observed = _observe(model, _items(tmp_path))
    if os.environ.get("NVRM_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(observed, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
        pytest.skip("golden fixture rewritten")
    expected = json.loads(GOLDEN.read_text())
    assert observed["contract"] == expected["contract"]
    for name, exp in expected["items"].items():
        got = observed["items"][name]
        for key in ("num_tokens", "input_ids_sha256", "pixel_values_sha256", "image_grid_thw", "candidate_times"):
            assert got[key] == exp[key], f"{name}.{key}"
        assert got["context_times"] == pytest.approx(exp["context_times"])
        assert got["reward"] == exp["reward"], f"{name}.reward"
