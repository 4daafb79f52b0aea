"""Training on a tiny bundle: loss goes down, ties, determinism, resume, export round trip."""

import json
import math

import pytest
import torch

from nvrm import InputError, RewardModel
from nvrm.bundle import verify_bundle
from nvrm.prefs.synthetic import MISMATCH, PHYSICS, write_task
from nvrm.train import TrainConfig
from nvrm.train.trainer import Trainer


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("task")
    files = write_task(d, n_train=6, n_eval=2, seed=3, variants=PHYSICS)  # 24 training pairs, 8 held out
    return files


def make(tiny_bundle, out, **kw):
    cfg = dict(epochs=2, batch_pairs=4, lr=3e-3, warmup_steps=2, lora_rank=4, seed=11, save_every=3, cache_inputs=True)
    cfg.update(kw)
    return Trainer(tiny_bundle, out, TrainConfig(**cfg), device="cpu", log_stream=open("/dev/null", "w"))


def losses(out):
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.slow
def test_loss_decreases_and_accuracy_beats_chance(tiny_bundle, task, tmp_path):
    t = make(tiny_bundle, tmp_path, epochs=4)
    pairs = t.load_pairs(task["train"], "training")
    before = t.evaluate(pairs)
    t.train(pairs)
    after = t.evaluate(pairs)
    ls = losses(tmp_path)
    assert len(ls) == 4 * 6
    assert sum(ls[-6:]) / 6 < sum(ls[:6]) / 6 - 0.05, ls
    assert after["accuracy"] > max(0.6, before["accuracy"]), (before["accuracy"], after["accuracy"])
    assert after["mean_margin"] > before["mean_margin"]


@pytest.mark.slow
def test_same_seed_same_run_and_resume_continues_exactly(tiny_bundle, task, tmp_path):
    full = make(tiny_bundle, tmp_path / "full")
    pairs = full.load_pairs(task["train"], "training")
    full.train(pairs)
    again = make(tiny_bundle, tmp_path / "again")
    again.train(again.load_pairs(task["train"], "training"))
    assert losses(tmp_path / "full") == losses(tmp_path / "again")  # deterministic with a seed

    # stop right after the first epoch's checkpoint (as a kill would), then resume in a fresh trainer
    part = make(tiny_bundle, tmp_path / "split")
    _train_one_epoch(part, part.load_pairs(task["train"], "training"))
    resumed = make(tiny_bundle, tmp_path / "split")
    assert resumed.resume() and resumed.progress.step == 6 and resumed.progress.epoch == 1
    resumed.train(resumed.load_pairs(task["train"], "training"))
    assert losses(tmp_path / "split") == pytest.approx(losses(tmp_path / "full"), abs=1e-6)
    assert torch.allclose(resumed.head.weight, full.head.weight, atol=1e-6)


def _train_one_epoch(trainer, pairs):
    """Run the 2-epoch schedule but stop after epoch 1 (as a kill would, right after its checkpoint)."""
    real = trainer.save

    class Stop(Exception):
        pass

    def save_then_maybe_stop():
        path = real()
        if trainer.progress.epoch == 1 and trainer.progress.micro == 0:
            raise Stop
        return path

    trainer.save = save_then_maybe_stop
    with pytest.raises(Stop):
        trainer.train(pairs)


def test_ties_train_with_the_rao_kupper_loss(tiny_bundle, task, tmp_path):
    rows = [json.loads(x) for x in task["train"].read_text().splitlines()][:8]
    for r in rows[:3]:
        r["tie"] = True
    tied = tmp_path / "tied.jsonl"
    tied.write_text("".join(json.dumps({**r, "context": str(task["train"].parent / r["context"]),
                                         "chosen": str(task["train"].parent / r["chosen"]),
                                         "rejected": str(task["train"].parent / r["rejected"])}) + "\n" for r in rows))
    t = make(tiny_bundle, tmp_path / "out", epochs=1)
    t.train(t.load_pairs(tied, "training"))
    assert t.tau == pytest.approx(math.log(2))
    assert all(math.isfinite(x) for x in losses(tmp_path / "out"))
    with pytest.raises(InputError, match="tie_margin=0.0.*tie margin > 0"):
        make(tiny_bundle, tmp_path / "zero", epochs=1, tie_margin=0.0).train(t.load_pairs(tied, "training"))


@pytest.mark.slow
@pytest.mark.parametrize("lora_vision", [False, True])
def test_export_round_trip_gives_the_trained_rewards(tiny_bundle, task, tmp_path, lora_vision):
    t = make(tiny_bundle, tmp_path / "run", epochs=1, lora_vision=lora_vision)
    pairs = t.load_pairs(task["train"], "training")
    t.train(pairs)
    bundle, merged = t.export(tmp_path / "bundle", task["train"], None, {"note": "test"})
    report = verify_bundle(bundle)
    assert report.revision == merged.revision and report.revision.startswith("nvrm-train-")
    names = {p.name for p in bundle.iterdir()}
    assert {"config.json", "nvrm_head.safetensors", "model.safetensors.index.json", "RELEASE_MANIFEST.json", "nvrm_training.json", "tokenizer.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    from safetensors import safe_open

    base_keys, new_keys = set(), set()
    for folder, keys in ((tiny_bundle, base_keys), (bundle, new_keys)):
        for f in folder.glob("model-*.safetensors"):
            with safe_open(str(f), "pt") as h:
                keys.update(h.keys())
    assert {k.removeprefix("model.") for k in base_keys} == new_keys  # Qwen3VLModel layout, no LoRA keys
    loaded = RewardModel.from_pretrained(bundle, device="cpu")
    p = pairs[0]
    for cand in (p.chosen, p.rejected):
        assert loaded.score(p.prompt, p.context, cand).reward == merged.score(p.prompt, p.context, cand).reward
    # training changed the merged weights (compared as weights: two bf16 rewards may round alike by luck)
    import torch

    def weights(folder):
        out = {}
        for f in folder.glob("model*.safetensors"):
            with safe_open(str(f), "pt") as h:
                out.update({k.removeprefix("model."): h.get_tensor(k).float() for k in h.keys()})
        return out

    before, after = weights(tiny_bundle), weights(bundle)
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    assert any("q_proj" in k or "v_proj" in k for k in changed), changed[:5]


@pytest.mark.slow
def test_mismatch_pairs_score_the_rejected_side_under_its_own_prompt_and_context(tiny_bundle, tmp_path):
    """Trainer and ``nvrm eval`` give a mismatch pair's rejected side its own prompt / context."""
    from nvrm.prefs.pairs import read_pairs
    from nvrm.report.evaluate import evaluate_pairs

    files = write_task(tmp_path / "task", n_train=3, n_eval=0, seed=4, variants=MISMATCH)
    pairs = read_pairs(files["train"])
    assert [p.shares_condition for p in pairs] == [False] * 6
    swap_prompt = [p for p in pairs if p.rejected_prompt is not None]
    swap_context = [p for p in pairs if p.rejected_context is not None]
    assert len(swap_prompt) == len(swap_context) == 3
    assert all(p.rejected == p.chosen and p.rejected_prompt != p.prompt for p in swap_prompt)
    assert all(p.rejected == p.chosen and p.rejected_context != p.context for p in swap_context)
    assert any("texture_context" in p.rejected_context for p in swap_context)  # the probe's fallback context
    assert any("texture_context" not in p.rejected_context for p in swap_context)  # another example's context

    rm = RewardModel.from_pretrained(tiny_bundle, device="cpu")
    outcomes, problems = evaluate_pairs(rm, pairs)
    assert problems == []
    for p, o in zip(pairs, outcomes):
        (cp, cc, cv), (rp, rc, rv) = p.sides
        assert o.chosen == rm.score(cp, cc, cv).reward
        assert o.rejected == rm.score(rp, rc, rv).reward

    t = make(tiny_bundle, tmp_path / "run")
    loaded = t.load_pairs(files["train"], "training")
    encoded = t.feed.collect(t.feed.submit(list(enumerate(loaded))))
    for e in encoded:
        (cp, cc, cv), (rp, rc, rv) = e.pair.sides
        want = rm.engine.submit_item(rp, rc, rv).result().encoded
        assert torch.equal(e.rejected.input_ids, want.input_ids) and torch.equal(e.rejected.positions, want.positions)
        if e.pair.rejected_prompt is not None:  # the prompt's tokens differ from the chosen side's
            assert not torch.equal(e.rejected.input_ids, e.chosen.input_ids)
    t.train(loaded)  # a training step over mismatch pairs runs
    assert len(losses(tmp_path / "run")) == 2 * 2
