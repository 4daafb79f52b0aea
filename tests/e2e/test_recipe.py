"""The preference-data recipe of docs/preference-data.md, run as written: rollouts -> nvrm prefs pairs ->
nvrm prefs judge (transformers serve and nvrm as the two judges) -> nvrm prefs filter -> nvrm train ->
nvrm eval --judgments (issue 31, item 5). ``artifacts/WORL-NVRM`` is a release-shaped tiny bundle."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from judge_server import TransformersServe, build_chat_vlm

DOC = Path(__file__).resolve().parents[2] / "docs" / "preference-data.md"


def recipe() -> str:
    found = re.search(r"<!-- run: preference-recipe[^>]*-->\n```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    assert found, "docs/preference-data.md has no preference-recipe block"
    return found.group(1)


def test_the_preference_recipe_runs_end_to_end(tmp_path, tiny_bundle):
    from nvrm.synth.clips import moving_square, write_video

    work = tmp_path / "work"
    (work / "artifacts").mkdir(parents=True)
    shutil.copytree(tiny_bundle, work / "artifacts" / "WORL-NVRM")
    rows = []
    for r in range(3):
        write_video(work / f"ctx{r}.mp4", moving_square(48, 96, 128, seed=40 + r), 8)
        cands = []
        for c in range(3):
            write_video(work / f"r{r}_{c}.mp4", moving_square(48, 96, 128, seed=50 + 3 * r + c, speed=1 + 3 * c), 8)
            cands.append(f"r{r}_{c}.mp4")
        rows.append({"id": f"r{r}", "prompt": f"a square glides, take {r}", "context": f"ctx{r}.mp4", "candidates": cands})
    (work / "rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    server = TransformersServe(build_chat_vlm(tmp_path / "vlm"), tmp_path).start()
    try:
        env = {**os.environ, "JUDGE_URL": server.url, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", recipe()], cwd=work, env=env, capture_output=True, text=True, timeout=1500)
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not server.failures(), server.failures()  # its model loaded once, by the judge's first request alone
    pairs = [json.loads(x) for x in (work / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == 6 and all(len(p["rewards"]) == 2 for p in pairs)  # --k 2 of 3 rollouts
    judgments = [json.loads(x) for x in (work / "judgments.jsonl").read_text().splitlines()]
    assert sorted({j["judge"] for j in judgments}) == ["nvrm:WORL-NVRM", "qwen"] and len(judgments) == 6 * 2 * 2
    assert all(j["winner"] is None and j["unparsed"] for j in judgments if j["judge"] == "qwen" and not _parses(j["raw"]))
    kept = [json.loads(x) for x in (work / "train_pairs.jsonl").read_text().splitlines()]
    assert kept and {(k["chosen"], k["rejected"]) for k in kept} <= (
        {(j["first"], j["second"]) for j in judgments} | {(j["second"], j["first"]) for j in judgments}
    )
    assert (work / "run" / "bundle" / "nvrm_head.safetensors").is_file()
    last = done.stdout.strip().splitlines()
    agree = [line for line in last if line.startswith("agreement with judge nvrm:WORL-NVRM")]
    assert agree and re.search(r": (\d\.\d{4}) over (\d+) order-consistent verdicts", agree[0]), last


def _parses(raw: str | None) -> bool:
    from nvrm.prefs.verdict import parse_verdict

    return parse_verdict(raw or "").winner is not None
