"""nvrm batch --ray on a local Ray cluster started by the test (2 CPUs, loopback)."""

import json
import shutil

import pytest
import ray  # installed by the test extra: these tests run in CI, never skipped

from nvrm.cli.main import main
from helpers import GROUP_ULPS, bf16_ulp

pytestmark = pytest.mark.exclusive  # a local Ray cluster of its own: one at a time under make test's two workers




@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 1024 * 1024)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, clips):
    d = tmp_path_factory.mktemp("rayjob")
    for k in ("context", "cand_a", "cand_b", "short"):
        shutil.copy(clips[k], d / clips[k].name)
    rows = [{"id": f"s{i}", "prompt": f"p{i % 2}", "context": "context.mp4", "candidate": ["cand_a.mp4", "cand_b.mp4"][i % 2]} for i in range(6)]
    rows.append({"id": "g", "prompt": "g", "context": "context.mp4", "candidates": ["cand_a.mp4", "short.mp4", "cand_b.mp4"]})
    rows.append({"id": "gone", "prompt": "p", "context": "missing.mp4", "candidates": ["cand_a.mp4", "cand_b.mp4"]})
    lines = [json.dumps(r) for r in rows] + ['{"id": 5, "prompt": ']
    (d / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return d


def rows_of(path):
    return {(r["id"], r["candidate_index"]): r for r in map(json.loads, path.read_text().splitlines())}


def test_ray_job_writes_the_same_rows_as_the_single_process_job(cluster, tiny_bundle, manifest, capsys):
    single, distributed = manifest / "single.jsonl", manifest / "ray.jsonl"
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(manifest / "manifest.jsonl"), "--output", str(single)]) == 0
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(manifest / "manifest.jsonl"), "--output", str(distributed),
                 "--ray", "--replicas", "2"]) == 0
    assert "nvrm batch (ray, 2 replica(s)): scored 8, failed 4" in capsys.readouterr().out
    a, b = rows_of(single), rows_of(distributed)
    assert len(distributed.read_text().splitlines()) == len(b) == len(a) == 12
    assert set(a) == set(b)
    for key, ra in a.items():
        rb = b[key]
        assert (ra["error"] is None) == (rb["error"] is None), key
        if ra["error"] is None:
            assert abs(ra["reward"] - rb["reward"]) <= GROUP_ULPS * bf16_ulp(ra["reward"]), key
        else:
            assert ra["error"] == rb["error"]
        assert rb["contract"] == ra["contract"] and rb["model_revision"] == "tiny-test-0001"
    assert "the contract needs 5.00 s" in b[("g", 1)]["error"] and "file not found" in b[("gone", 1)]["error"]


def test_ray_resume_skips_rows_already_written(cluster, tiny_bundle, manifest, capsys):
    full = manifest / "single.jsonl"
    if not full.exists():
        assert main(["batch", "--model", str(tiny_bundle), "--input", str(manifest / "manifest.jsonl"), "--output", str(full)]) == 0
    part = manifest / "part.jsonl"
    lines = full.read_text().splitlines()
    part.write_text("\n".join(lines[:5]) + "\n" + lines[5][:30])  # five rows and a torn sixth
    capsys.readouterr()
    assert main(["batch", "--model", str(tiny_bundle), "--input", str(manifest / "manifest.jsonl"), "--output", str(part), "--ray", "--resume"]) == 0
    assert "skipped 5 already in the output" in capsys.readouterr().out
    text = part.read_text().splitlines()
    keys = [(r["id"], r["candidate_index"]) for r in map(json.loads, text)]
    assert len(keys) == len(set(keys)) == 12
    assert text[:5] == lines[:5]  # rows already there were kept, not rewritten
