"""``nvrm.train.prepare_store`` and ``Summary`` called from Python, as the benchmarks and notebooks do (issue 37)."""

from __future__ import annotations

import json

from nvrm.settings import LoadSettings
from nvrm.train import StoreBuild, Summary, prepare_store
from nvrm.train.store import read_entries


def test_prepare_store_lists_a_bad_video_and_resumes(tiny_bundle, clips, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "p", "context": str(clips["context"]), "chosen": str(clips["cand_a"]), "rejected": str(clips["cand_b"])},
            {"prompt": "p", "context": str(clips["context"]), "chosen": str(clips["cand_a"]), "rejected": str(tmp_path / "nope.mp4")}]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = tmp_path / "store"
    built = prepare_store(str(tiny_bundle), [pairs], store, settings=LoadSettings(workers=1))
    assert isinstance(built, StoreBuild) and built.videos == 4 and built.stored == 3 and built.failed == 1
    [(path, role, message)] = built.failures
    assert path.endswith("nope.mp4") and role == "candidate" and "\n" not in message
    assert len(read_entries(store)) == 3
    again = prepare_store(str(tiny_bundle), [pairs], store, settings=LoadSettings(workers=1))
    assert (again.stored, again.skipped, again.failed) == (0, 3, 1)


def test_a_summary_is_the_json_it_writes():
    done = Summary(world_size=2, steps=4, train_seconds=1.5, weights_in_sync=True, bundle="out/bundle", revision="r1",
                   eval={"n": 4, "accuracy": 1.0}, export_max_abs_diff=0.0, rank=1)
    assert done.to_dict() == {"world_size": 2, "steps": 4, "train_seconds": 1.5, "weights_in_sync": True, "bundle": "out/bundle",
                              "revision": "r1", "eval": {"n": 4, "accuracy": 1.0}, "export_max_abs_diff": 0.0}
    stopped = Summary(world_size=1, steps=2, train_seconds=0.5, weights_in_sync=True, stopped_early=True)
    assert stopped.to_dict() == {"world_size": 1, "steps": 2, "train_seconds": 0.5, "weights_in_sync": True, "stopped_early": True}
