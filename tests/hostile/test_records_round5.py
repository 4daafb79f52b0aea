"""Hostile records and frames (issue 54, round 5): bad record rows are skipped and counted in one line by ``nvrm prefs
pairs --from-record`` and ``nvrm refresh`` (a non-numeric reward, a missing prompt, NaN or infinite rewards, paths
leading out of the record folder), two writers on one record folder are refused naming the holder, and float frames
on the wrong scale (0..255, or [-1, 1]) are refused with the fix instead of clamped into a white or black video."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from nvrm import Clip, Contract, Limits
from nvrm.cli.main import main
from nvrm.errors import InputError
from nvrm.record.capture import Recorder, from_rl
from nvrm.record.reader import load_frames, read_rows
from nvrm.refresh.cycle_stages import stage_record
from nvrm.rl.calls import video_of
from nvrm.scoring.differentiable import as_videos
from nvrm.synth.clips import moving_square

from helpers import free_port

CTX = Clip(moving_square(2, 64, 32, seed=1), fps=1)


class Result:
    def __init__(self, reward):
        self.reward, self.model_revision = reward, "r1"


def candidate(seed):
    return Clip(moving_square(5, 64, 32, seed=seed, speed=1 + seed % 3), fps=1)


def write_record(root: Path) -> Path:
    """A record of two groups: prompt p with 3 candidates (rewards 1, 2, 3), prompt q with 2 (4, 5)."""
    rec = Recorder(root)
    rec.offer([("p", CTX, "ctx", candidate(10 + i)) for i in range(3)], [Result(float(i + 1)) for i in range(3)],
              contract=Contract(), limits=Limits(), revision=None)
    rec.offer([("q", CTX, "ctx", candidate(20 + i)) for i in range(2)], [Result(4.0), Result(5.0)],
              contract=Contract(), limits=Limits(), revision=None)
    rec.writer.flush()
    rec.close()
    return root


def key(n: int) -> str:
    return f"{n:064x}"


def poison(root: Path, outside: Path) -> dict[str, int]:
    """Append bad rows to group p, each with a candidate of its own (so that, taken, it would make pairs); returns the
    expected count per reason."""
    rows, _ = read_rows(root)
    base = rows[0]
    good_file = root / base["candidate"]["path"]

    def own_candidate(n: int) -> dict:
        rel = f"candidates/{key(n)[:2]}/{key(n)}.npy"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(good_file, root / rel)
        return {"key": key(n), "path": rel, "times": base["candidate"]["times"]}

    outside.mkdir(parents=True, exist_ok=True)
    np.save(outside / "frames.npy", np.load(good_file))
    linked = f"candidates/{key(9)[:2]}/{key(9)}.npy"
    (root / linked).parent.mkdir(parents=True, exist_ok=True)
    (root / linked).symlink_to(outside / "frames.npy")  # inside by name, outside in fact
    bad = [
        {**base, "candidate": own_candidate(1), "reward": "abc"},
        {k: v for k, v in {**base, "candidate": own_candidate(2)}.items() if k != "prompt"},
        {**base, "candidate": own_candidate(3), "reward": float("nan")},
        {**base, "candidate": own_candidate(4), "reward": float("inf")},
        {**base, "candidate": own_candidate(5), "reward": -float("inf")},
        {**base, "candidate": {**own_candidate(6), "path": "/etc/hostname"}},
        {**base, "candidate": {**own_candidate(7), "path": f"../{outside.name}/frames.npy"}},
        {**base, "candidate": {"key": key(9), "path": linked, "times": base["candidate"]["times"]}},
        {**base, "candidate": own_candidate(8), "context": {**base["context"], "path": "/etc/hostname"}},
    ]
    seg = sorted((root / "rows").glob("*.jsonl"))[-1]
    with open(seg, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in bad))  # json writes NaN and Infinity, as Python's json reads them
    return {"a reward that is not a number": 1, "no prompt (or not text)": 1, "a NaN or infinite reward": 3,
            "'candidate' path is not inside the record folder": 3, "'context' path is not inside the record folder": 1}


@pytest.fixture
def poisoned(tmp_path):
    root = write_record(tmp_path / "record")
    return root, poison(root, tmp_path / "outside")


def one_line_about_rows(text: str) -> str:
    lines = [line for line in text.splitlines() if "record rows" in line]
    assert len(lines) == 1, text
    return lines[0]


def test_pairs_from_a_record_skip_bad_rows_and_count_them_in_one_line(poisoned, tmp_path, capsys):
    root, reasons = poisoned
    out = tmp_path / "pairs.jsonl"
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(out)]) == 0
    captured = capsys.readouterr()
    line = one_line_about_rows(captured.err)
    assert "skipped 9 of 14 record rows" in line and "000000000000.jsonl line 6" in line, line
    for reason, n in reasons.items():
        assert f"{reason}: {n}" in line, line
    pairs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(pairs) == 3 + 1  # p: its three good candidates; q: its two
    real = root.resolve()
    for p in pairs:
        for side in ("context", "a", "b"):
            assert Path(p[side]).resolve().is_relative_to(real) and "outside" not in p[side], p
    least = tmp_path / "least.jsonl"
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(least), "--strategy", "uncertain", "--k", "1"]) == 0
    assert all(math.isfinite(r) for p in map(json.loads, least.read_text().splitlines()) for r in p["rewards"])


def test_refresh_takes_the_good_rows_of_a_record_with_bad_ones(poisoned, tmp_path):
    root, reasons = poisoned
    said = []
    cycle = types.SimpleNamespace(record=root, say=said.append)
    stage_record(cycle, tmp_path / "cycle" / "record")
    line = one_line_about_rows("\n".join(said))
    assert line.startswith("nvrm refresh: record: skipped 9 of 14 record rows"), line
    assert all(f"{reason}: {n}" in line for reason, n in reasons.items()), line
    groups = [json.loads(x) for x in (tmp_path / "cycle" / "record" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(len(g["candidates"]) for g in groups) == [2, 3]
    assert sorted(r for g in groups for r in g["rewards"]) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(list((tmp_path / "cycle" / "record" / "media").glob("*.mp4"))) == 6  # one context, five candidates


def test_a_row_only_of_bad_rows_is_no_traceback(tmp_path, capsys):
    root = tmp_path / "record"
    root.mkdir()
    (root / "record.json").write_text('{"format": "nvrm-record", "version": 1}\n')
    (root / "rows").mkdir()
    (root / "rows" / "000000000000.jsonl").write_text('{"group": "g", "candidate": {"path": "/etc/hostname"}, "reward": "x"}\n[1]\n')
    assert main(["prefs", "pairs", "--from-record", str(root), "--output", str(tmp_path / "o.jsonl")]) in (0, 2)
    assert "skipped 2 of 2 record rows" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["/etc/hostname", "../x.npy", "candidates/../../x.npy"])
def test_frames_outside_the_record_are_never_loaded(tmp_path, path):
    root = write_record(tmp_path / "record")
    with pytest.raises(InputError, match="outside the record folder"):
        load_frames(root, {"path": path})


# ---------------------------------------------------------------- two writers on one folder


def test_a_second_writer_in_this_process_is_refused_naming_it(tmp_path):
    root = tmp_path / "record"
    first = Recorder(root)
    with pytest.raises(InputError) as e:
        Recorder(root)
    assert "\n" not in str(e.value) and "being written by this process" in str(e.value) and str(root) in str(e.value)
    with pytest.raises(InputError, match="one writer per folder"):
        from_rl(root)
    first.close()
    Recorder(root).close()  # the folder is free again once its writer closed


def test_a_second_writer_in_another_process_is_refused_naming_its_pid(tmp_path):
    root = tmp_path / "record"
    code = "import sys; from nvrm.record.capture import Recorder; r = Recorder(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", code, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"being written by pid {holder.pid}"):
            Recorder(root)
    finally:
        holder.stdin.close()
        holder.wait(60)
    Recorder(root).close()  # the lock goes with its process


def test_serve_on_a_held_record_folder_is_one_line(tmp_path, tiny_bundle):
    root = tmp_path / "record"
    held = Recorder(root)
    try:
        proc = subprocess.run([str(Path(sys.executable).parent / "nvrm"), "serve", "--model", str(tiny_bundle), "--port", str(free_port()),
                               "--record", str(root)], capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"nvrm: error: {root}: this record folder is being written by pid {os.getpid()}" in proc.stderr, proc.stderr[-2000:]


# ---------------------------------------------------------------- float frames on the wrong scale


def white_wan_video():
    """A [T, C, H, W] video in 0..255 as float: a forgotten ``/ 255`` (clamped, it is 99.6 % white)."""
    return torch.from_numpy(moving_square(10, 32, 32, seed=3)).permute(0, 3, 1, 2).float()


@pytest.mark.parametrize("as_numpy", [False, True], ids=["tensor", "numpy"])
def test_frames_in_0_255_are_refused_with_the_fix(as_numpy):
    video = white_wan_video()
    got = video_of(video.numpy() if as_numpy else video, 2, "video 3")
    assert isinstance(got, InputError), got
    assert str(got).startswith("video 3: values up to ") and "divide by 255" in str(got), str(got)


def test_frames_in_minus_1_to_1_are_refused_with_the_fix():
    video = white_wan_video() / 127.5 - 1
    got = video_of(video, 2, "video 0")
    assert isinstance(got, InputError) and "values down to -1.0" in str(got) and "(x + 1) / 2" in str(got), got


def test_a_small_overshoot_is_still_clamped():
    video = white_wan_video() / 255
    video[0, :, 0, 0] = torch.tensor([1.08, -0.05, 1.5])  # a decoder's overshoot, up to the bound
    clip = video_of(video.to(torch.bfloat16), 2, "video 0")
    assert isinstance(clip, Clip) and clip.frames.dtype == torch.uint8
    assert clip.frames[0, 0, 0].tolist() == [255, 0, 255]


def test_the_differentiable_reward_refuses_them_too():
    with pytest.raises(InputError, match="divide by 255"):
        as_videos(white_wan_video().permute(0, 2, 3, 1).contiguous())
    with pytest.raises(InputError, match=r"\(x \+ 1\) / 2"):
        as_videos((white_wan_video() / 127.5 - 1).unsqueeze(0))
    as_videos(white_wan_video().unsqueeze(0) / 255 * 1.1 - 0.05)  # an overshoot: clamped as before


def test_an_rl_adapter_fails_the_item_naming_the_cause(demo):
    from nvrm.rl import flow_grpo_reward

    model, ctx, _ = demo
    fn = flow_grpo_reward(model, fps=2, on_error=-5.0)("cpu")
    good = white_wan_video() / 255
    scores, info = fn([good, good * 255], ["a square"] * 2, [{"context_video": str(ctx)}] * 2)
    assert info["nvrm_failed"] == [1] and scores[1] == -5.0 and scores[0] != -5.0
    assert "divide by 255" in info["nvrm_errors"][1]
