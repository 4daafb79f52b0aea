"""nvrm probe: the battery of perturbations, the flags, the manifest summary and the HTML report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from PIL import Image

from nvrm import RewardModel
from nvrm.cli.main import main
from nvrm.probe import PERTURBATIONS, ProbeItem, probe, register

PROMPT = "A square glides across a tiled floor at constant speed."


@pytest.fixture(scope="module")
def demo_clips(tmp_path_factory):
    from nvrm.cli.demo import write_demo_clips

    return write_demo_clips(tmp_path_factory.mktemp("probeclips"))


@pytest.fixture(scope="module")
def demo_model():
    from nvrm.cli.demo import demo_bundle_path

    m = RewardModel.from_pretrained(demo_bundle_path(), device="cpu")
    yield m
    m.close()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The demo model with its head negated: it now prefers what the demo learned to penalise."""
    from safetensors.torch import load_file, save_file

    from nvrm.bundle import write_manifest
    from nvrm.cli.demo import demo_bundle_path

    path = tmp_path_factory.mktemp("planted") / "bundle"
    shutil.copytree(demo_bundle_path(), path)
    head = load_file(str(path / "nvrm_head.safetensors"))
    save_file({k: -v for k, v in head.items()}, str(path / "nvrm_head.safetensors"))
    (path / "nvrm_guard.safetensors").unlink()  # the demo's guard was fitted for the head this negates (it would be refused)
    write_manifest(path, revision="planted-inverted-head")
    return path


def test_the_battery_is_documented_and_seeded(demo_clips):
    ctx, cands = demo_clips
    assert {"freeze", "reverse", "shuffle", "stutter", "shift", "teleport", "flicker", "blur", "noise", "brightness", "lowres",
            "letterbox", "copy_context", "static_image", "swap_prompt", "swap_context"} <= set(PERTURBATIONS)
    assert all(p.description and p.degrades for p in PERTURBATIONS.values())
    from nvrm.probe.suite import load_clip

    item = ProbeItem(PROMPT, load_clip(ctx, None, None), load_clip(cands["smooth"], 7, None))
    for name in ("shuffle", "stutter", "noise", "static_image"):
        a = PERTURBATIONS[name].apply(item, np.random.default_rng(3)).candidate.numpy()
        b = PERTURBATIONS[name].apply(item, np.random.default_rng(3)).candidate.numpy()
        assert np.array_equal(a, b), name  # same seed, same frames
        assert not np.array_equal(a, item.candidate.numpy()[: len(a)]), name  # and really changed


def test_the_demo_model_flags_nothing_for_the_smooth_clip(demo_model, demo_clips):
    ctx, cands = demo_clips
    report = probe(demo_model, PROMPT, ctx, cands["smooth"])
    assert report.flagged == [], report.flagged
    deltas = {o.name: o.delta for o in report.outcomes}
    assert deltas["freeze"] < 0 and deltas["reverse"] < 0 and deltas["teleport"] < 0
    assert all(o.p_preferred < 0.5 for o in report.outcomes)


def test_a_planted_blind_spot_is_flagged(planted, demo_clips):
    ctx, cands = demo_clips
    with RewardModel.from_pretrained(planted, device="cpu") as m:
        report = probe(m, PROMPT, ctx, cands["smooth"], perturbations=["freeze", "reverse", "teleport"])
    assert set(report.flagged) == {"freeze", "reverse", "teleport"}
    assert all(o.delta > 0 and o.p_preferred > 0.5 for o in report.outcomes)


def test_users_can_add_their_own_perturbation(demo_model, demo_clips):
    @register("mirror", "frames flipped left-right")
    def mirror(item, rng):
        return item.with_candidate(item.candidate.numpy()[:, :, ::-1])

    try:
        ctx, cands = demo_clips
        report = probe(demo_model, PROMPT, ctx, cands["smooth"], perturbations=["mirror", "freeze"])
        assert [o.name for o in report.outcomes] == ["mirror", "freeze"] and report.outcomes[0].reward is not None
    finally:
        PERTURBATIONS.pop("mirror")


def test_probe_cli_json_and_html_report_in_headless_chromium(demo_clips, planted, tmp_path, capsys):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("Debian's chromium is not installed; `make test` installs it (apt-get install chromium)")
    ctx, cands = demo_clips
    html = tmp_path / "probe.html"
    rc = main(["probe", "--model", str(planted), "--prompt", PROMPT, "--context", str(ctx), "--candidate", str(cands["smooth"]),
               "--perturbations", "freeze,reverse,noise,swap_prompt", "--html", str(html), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["flagged"]  # something flagged: exit 1, as a gate for scripts
    clip = out["clips"][0]
    assert [o["name"] for o in clip["outcomes"]] == ["freeze", "reverse", "noise", "swap_prompt"]
    page = html.read_text()
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(common + ["--virtual-time-budget=5000", "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120).stdout
    n_images = page.count("<img ")
    assert f'data-images-ok="{n_images}"' in dom and n_images == 3 + 5 * 5  # 3 context frames, 5 for the original and each variant
    bars = {m.group(1): (float(m.group(2)), m.group(3) == "true") for m in re.finditer(r'data-name="([^"]+)" data-delta="([^"]+)" data-flagged="(\w+)"', dom)}
    for o in clip["outcomes"]:
        assert bars[o["name"]][0] == pytest.approx(o["delta"], rel=1e-6) and bars[o["name"]][1] == o["flagged"]
    shot = tmp_path / "shot.png"
    subprocess.run(common + ["--window-size=1280,1400", f"--screenshot={shot}", html.as_uri()], capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (1400, 1280, 3) and pixels.std() > 20


def test_probe_over_a_manifest_summarises_per_perturbation(demo_clips, tmp_path, capsys):
    ctx, cands = demo_clips
    manifest = tmp_path / "m.jsonl"
    rows = [{"id": "a", "prompt": PROMPT, "context": str(ctx), "candidate": str(cands["smooth"])},
            {"id": "b", "prompt": PROMPT, "context": str(ctx), "candidates": [str(cands["frozen"])]}]
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    from nvrm.cli.demo import demo_bundle_path

    rc = main(["probe", "--model", str(demo_bundle_path()), "--input", str(manifest), "--perturbations", "freeze,reverse,swap_context", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and len(out["clips"]) == 2
    s = out["summary"]
    assert set(s) == {"freeze", "reverse", "swap_context"}
    deltas = [c["outcomes"][1]["delta"] for c in out["clips"]]  # reverse, per clip
    assert s["reverse"]["n"] == 2 and s["reverse"]["mean_delta"] == pytest.approx(sum(deltas) / 2)
    assert s["reverse"]["raised_fraction"] == sum(d > 0 for d in deltas) / 2
    assert torch.isfinite(torch.tensor(s["reverse"]["std_delta"]))


def test_list_needs_no_model_and_a_missing_model_is_one_line(capsys):
    from nvrm.cli.main import main

    assert main(["probe", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(PERTURBATIONS)
    assert main(["probe", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--model" in err


def test_an_incomplete_probe_never_passes_the_gate(demo_clips, tmp_path, capsys):
    from nvrm.cli.demo import demo_bundle_path

    ctx, cands = demo_clips
    missing = tmp_path / "gone.mp4"
    common = ["probe", "--model", str(demo_bundle_path()), "--prompt", PROMPT, "--context", str(ctx), "--perturbations", "noise"]
    assert main(common + ["--candidate", str(missing)]) == 2  # the only clip: one line, exit 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "gone.mp4" in err and "not probed" in err
    rc = main(common + ["--candidate", str(cands["smooth"]), "--candidate", str(missing), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert len(out["clips"]) == 2 and "error" in out["clips"][1] and out["errors"] == 1
    assert rc == (1 if out["flagged"] else 2)  # never 0 while a clip is missing
