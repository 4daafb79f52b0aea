"""Hostile files and arguments for the commands that read and write files: each ends in one line on
stderr and exit 2, or in a correct result, and no input file is ever overwritten."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from nvrm.cli.main import main

ROW = {"prompt": "p", "context": "c.mp4", "first": "a.mp4", "second": "b.mp4", "winner": "first"}


def judgments(tmp_path):
    path = tmp_path / "judgments.jsonl"
    flipped = {**ROW, "first": "b.mp4", "second": "a.mp4", "winner": "second"}
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + b'{"prompt": "\xff\xfe"}\n' + json.dumps(flipped).encode() + b"\n")
    return path


@pytest.mark.parametrize("flag", ["--output", "--removed"])
def test_prefs_filter_never_writes_over_its_input(tmp_path, capsys, flag):
    path = judgments(tmp_path)
    before = path.read_bytes()
    args = ["prefs", "filter", "--input", str(path), "--output", str(tmp_path / "pairs.jsonl")]
    args += ["--removed", str(path)] if flag == "--removed" else []
    if flag == "--output":
        args[args.index("--output") + 1] = str(tmp_path / "." / "judgments.jsonl")  # the same file, spelled otherwise
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is the same file as the input --input" in err
    assert path.read_bytes() == before


def test_prefs_filter_outputs_must_differ(tmp_path, capsys):
    path = judgments(tmp_path)
    out = tmp_path / "pairs.jsonl"
    assert main(["prefs", "filter", "--input", str(path), "--output", str(out), "--removed", str(out)]) == 2
    assert "is the same file as the output --output" in capsys.readouterr().err


def test_a_non_utf8_line_is_one_malformed_row(tmp_path, capsys):
    path = judgments(tmp_path)
    out, removed = tmp_path / "pairs.jsonl", tmp_path / "removed.jsonl"
    assert main(["prefs", "filter", "--input", str(path), "--output", str(out), "--removed", str(removed)]) == 0
    assert len(out.read_text().splitlines()) == 1  # the consistent pair of the two good rows
    reasons = [json.loads(line) for line in removed.read_text().splitlines()]
    assert [r["reason"] for r in reasons] == ["malformed"] and "not UTF-8" in reasons[0]["detail"]


def test_eval_plot_and_rank_report_never_overwrite_their_inputs(tmp_path, capsys, tiny_bundle):
    pairs = tmp_path / "pairs.png"
    pairs.write_text("{}\n")
    digest = hashlib.sha256(pairs.read_bytes()).hexdigest()
    assert main(["eval", "--model", str(tiny_bundle), "--pairs", str(pairs), "--plot", str(pairs)]) == 2
    assert "--plot" in capsys.readouterr().err and hashlib.sha256(pairs.read_bytes()).hexdigest() == digest
    video = tmp_path / "cand.mp4"
    video.write_bytes(b"x" * 10)
    link = tmp_path / "link.html"
    os.symlink(video, link)
    assert main(["rank", "--model", str(tiny_bundle), "--prompt", "p", "--context", str(video), str(video), "--html", str(link)]) == 2
    assert "is the same file as the input" in capsys.readouterr().err and video.read_bytes() == b"x" * 10


@pytest.mark.parametrize("flags, message", [
    (["--device", "cuda:7"], "device='cuda:7'"),
    (["--device", "tpu"], "device='tpu'"),
    (["--attention", "flash_attention_2", "--device", "cpu"], "flash_attention_2"),
    (["--workers", "100000"], "workers=100000 must be in 0..256"),
])
def test_impossible_load_settings_are_one_line(tiny_bundle, tmp_path, capsys, flags, message):
    import torch

    if flags[1] == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"never read")
    assert main(["score", "--model", str(tiny_bundle), *flags, "--prompt", "p", "--context", str(clip), "--candidate", str(clip)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_serve_size_flags_must_be_finite_budgets(tiny_bundle, capsys, value):
    assert main(["serve", "--model", str(tiny_bundle), "--context-cache-mb", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "context_cache_mb" in err


def test_an_unexpected_failure_is_one_line_without_v(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 275251200 bytes")

    from nvrm.cli.main import build_parser

    args = build_parser().parse_args(["score", "--model", "x", "--prompt", "p", "--context", "c", "--candidate", "c"])
    args.run = boom
    monkeypatch.setattr("nvrm.cli.main.build_parser", lambda **_: type("P", (), {"parse_args": lambda self, argv: args})())
    assert main([]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("nvrm: error: out of memory") and len(err.splitlines()) == 1


def test_display_rotation_is_not_applied_and_said_once(tmp_path, caplog):
    import logging
    import struct

    from nvrm import Contract
    from nvrm.video.inputs import prepare_input
    from nvrm.synth.clips import moving_square, write_video

    plain = write_video(tmp_path / "plain.mp4", moving_square(48, 64, 96, seed=1), 8)
    data = bytearray(plain.read_bytes())
    i = data.index(b"tkhd")
    off = i + 4 + (1 + 3 + 4 * 5 if data[i + 4] == 0 else 1 + 3 + 8 * 3 + 4 * 2) + 8 + 8  # the tkhd display matrix
    data[off : off + 36] = struct.pack(">9i", 0, 0x10000, 0, -0x10000, 0, 0, 0, 0, 0x40000000)  # rotate 90
    rotated = tmp_path / "rotated.mp4"
    rotated.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="nvrm"):
        a = prepare_input(plain, "candidate", Contract())
        b = prepare_input(rotated, "candidate", Contract())
        prepare_input(rotated, "candidate", Contract())
    said = [r.getMessage() for r in caplog.records if "display rotation" in r.getMessage()]
    assert len(said) == 1 and "rotated.mp4: display rotation -90° is not applied" in said[0]
    assert [im.tobytes() for im in a.images] == [im.tobytes() for im in b.images]  # scored as stored


def test_file_cache_keys_cannot_collide_across_path_and_content(tmp_path):
    from nvrm.serve.admission.media import file_key as _file_key

    (tmp_path / "ab").write_bytes(b"c")  # sha256(path + bytes) would be the same for these two
    (tmp_path / "a").write_bytes(b"bc")
    assert _file_key(str(tmp_path / "ab"), "x") != _file_key(str(tmp_path / "a"), "x")
    assert _file_key(str(tmp_path / "ab"), "x") == _file_key(str(tmp_path / "ab"), "x")


def test_hashing_a_file_is_bounded_in_time(tmp_path, monkeypatch):
    import nvrm.serve.admission.media as media
    from nvrm.errors import InputError

    path = tmp_path / "big.mp4"
    path.write_bytes(b"x" * (3 << 20))
    monkeypatch.setattr(media, "FILE_READ_SECONDS", -1)  # a read that is already late: a stalled mount
    with pytest.raises(InputError, match="could not be read within -1 s"):
        media.file_key(str(path), "items[0].context")


def test_relative_names_with_a_colon_are_files_not_protocols(model, clips, tmp_path, monkeypatch):
    """Issue 33, item 20: take:1.mp4 and ./take:1.mp4 were refused as "Protocol not found"."""
    import shutil

    shutil.copy(clips["cand_a"], tmp_path / "take:1.mp4")
    monkeypatch.chdir(tmp_path)
    want = model.score("p", clips["context"], clips["cand_a"]).reward
    for name in ("take:1.mp4", "./take:1.mp4", str(tmp_path / "take:1.mp4")):
        assert model.score("p", clips["context"], name).reward == want
