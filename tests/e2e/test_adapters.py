"""Reward adapters for RL trainers, on the shipped demo model.

TRL is installed by the test extra and exercised for real: its GRPOTrainer calls the adapter on its own
reward path (``_calculate_rewards``) and in a real training step. verl and flow-GRPO cannot be installed
next to this project's pins (verl needs transformers 5.x or numpy < 2; flow-GRPO is not a package), so
their adapters are tested against the call signatures their code uses (see nvrm/adapters.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nvrm import Clip, RewardModel
from nvrm.adapters import Normalize, flow_grpo_reward, trl_reward, verl_compute_score
from nvrm.errors import RewardFnError

PROMPT = "A square glides across a tiled floor at constant speed."


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from nvrm.cli.demo import demo_bundle_path, write_demo_clips

    ctx, cands = write_demo_clips(tmp_path_factory.mktemp("democlips"))
    m = RewardModel.from_pretrained(demo_bundle_path(), device="cpu")
    yield m, ctx, cands
    m.close()


def tiny_policy():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789 .,:/_-":
        vocab.setdefault(c, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg), tok


def test_trl_grpo_trainer_calls_the_adapter_on_its_own_reward_path(demo, tmp_path):
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, ctx, cands = demo
    assert trl.__version__ == "1.16.0"
    rows = [{"prompt": "a square moves", "context_video": str(ctx), "candidate_video": str(cands[name])} for name in ("smooth", "frozen", "reversed", "teleport")]
    policy, tok = tiny_policy()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=4, max_steps=1,
                      logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", beta=0.0, dataloader_num_workers=0)
    reward = trl_reward(model, candidate_key="candidate_video", prompt_key="reward_prompt")
    ds = Dataset.from_list([{**r, "reward_prompt": PROMPT} for r in rows])
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok)

    inputs = [{**rows[0], "reward_prompt": PROMPT}, {**rows[1], "reward_prompt": PROMPT},
              {**rows[2], "reward_prompt": PROMPT}, {**rows[3], "candidate_video": str(tmp_path / "missing.mp4"), "reward_prompt": PROMPT}]
    got = trainer._calculate_rewards(inputs, [r["prompt"] for r in inputs], ["x", "y", "z", "w"], [[3], [4], [5], [6]])
    want = [r.reward for r in model.score_group(PROMPT, ctx, [cands["smooth"], cands["frozen"], cands["reversed"]])]
    assert got.shape == (4, 1)
    assert got[:3, 0].tolist() == pytest.approx(want, abs=1e-6)  # float32 of the bf16 rewards
    assert math.isnan(got[3, 0].item())  # a failed item is None -> NaN: left out of the reward sum, never 0.0
    trainer.train()  # one real GRPO step: generation, then the adapter on TRL's own reward path
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 1
    assert math.isfinite(steps[0]["rewards/nvrm_reward/mean"])
    assert "nvrm_reward/failed_fraction" in steps[0]  # failures are counted in TRL's own logs


def test_trl_adapter_takes_the_completion_as_the_candidate_and_groups_by_context(demo, monkeypatch):
    model, ctx, cands = demo
    calls = []
    real = model.score_groups
    monkeypatch.setattr(model, "score_groups", lambda groups, **k: calls.append(len(list(groups := list(groups)))) or real(groups, **k))
    fn = trl_reward(model)
    conversational = [[{"role": "assistant", "content": str(cands["smooth"])}], [{"role": "assistant", "content": str(cands["frozen"])}]]
    out = fn(prompts=[PROMPT, PROMPT], completions=conversational, completion_ids=None, context_video=[str(ctx)] * 2, trainer_state=None)
    assert calls == [1]  # one group: both share the prompt and the context
    want = [r.reward for r in model.score_group(PROMPT, ctx, [cands["smooth"], cands["frozen"]])]
    assert out == want and out[0] > out[1]
    with pytest.raises(RewardFnError, match="no 'context_video' column"):
        fn(prompts=[PROMPT], completions=["a.mp4"])


def test_verl_compute_score_signature(demo):
    """verl calls compute_score(data_source=, solution_str=, ground_truth=, extra_info=) per sample (verl not installable here)."""
    model, ctx, cands = demo
    fn = verl_compute_score(model)
    info = {"prompt": PROMPT, "context_video": str(ctx), "candidate_video": str(cands["smooth"])}
    out = fn(data_source="nvrm", solution_str="ignored", ground_truth=None, extra_info=info)
    assert out == {"score": model.score(PROMPT, ctx, cands["smooth"]).reward, "nvrm_ok": 1.0}
    bad = {**info, "candidate_video": "/nonexistent.mp4"}
    with pytest.raises(RewardFnError, match="file not found"):
        fn(data_source="nvrm", solution_str="", ground_truth=None, extra_info=bad)
    filled = verl_compute_score(model, on_error=-1.0, candidate_key=None)
    many = filled.batch(["nvrm"] * 2, [str(cands["smooth"]), "/nonexistent.mp4"], [None, None], [info, info])
    assert many[0]["nvrm_ok"] == 1.0 and many[1] == {"score": -1.0, "nvrm_ok": 0.0}


def test_flow_grpo_factory_signature(demo):
    """flow-GRPO calls fn(videos [B,T,C,H,W] float in [0,1], prompts, metadata) and wants (scores, info)."""
    from nvrm.video.decode import decode_frames

    model, ctx, cands = demo
    frames = [decode_frames(cands[n], max_seconds=6)[0] for n in ("smooth", "frozen")]
    n = min(len(f) for f in frames)
    videos = torch.stack([torch.from_numpy(f[:n]).permute(0, 3, 1, 2).float() / 255 for f in frames])  # [B, T, C, H, W]
    fn = flow_grpo_reward(model, fps=4.0)(device="cpu")
    scores, info = fn(videos, [PROMPT, PROMPT], [{"context_video": str(ctx)}, {"context_video": str(ctx)}])
    want = [r.reward for r in model.score_group(PROMPT, ctx, [Clip(f[:n], 4.0) for f in frames])]
    assert scores == want and info["nvrm_failed"] == []
    filled = flow_grpo_reward(model, fps=4.0, on_error=float("nan"))(None)
    scores, info = filled(videos[:, :4], [PROMPT] * 2, [{"context_video": str(ctx)}] * 2)  # 1 s: too short
    assert info["nvrm_failed"] == [0, 1] and all(math.isnan(s) for s in scores) and "5.00 s" in info["nvrm_errors"][0]
    with pytest.raises(RewardFnError):
        flow_grpo_reward(model, fps=4.0)(None)(videos[:, :4], [PROMPT] * 2, [{"context_video": str(ctx)}] * 2)


def test_normalisation_is_off_by_default_and_keeps_failures():
    assert not Normalize().active and Normalize()([1.0, None], [[0, 1]]) == [1.0, None]
    out = Normalize(group_whiten=True)([1.0, 3.0, None, 10.0, 10.0], [[0, 1, 2], [3, 4]])
    assert out[0] == pytest.approx(-1.0, abs=1e-5) and out[1] == pytest.approx(1.0, abs=1e-5) and out[2] is None
    assert out[3] == out[4] == 0.0
    clip = Normalize(clip=0.5)([2.0, -3.0, 0.1, None], [])
    assert clip == [0.5, -0.5, 0.1, None]
    run = Normalize(running=True)
    run([0.0, 2.0], [])
    later = run([4.0], [])
    assert run.stats.n == 3 and later[0] == pytest.approx((4.0 - 2.0) / (math.sqrt(8 / 3) + 1e-6))
    assert np.isclose(run.stats.std, np.std([0.0, 2.0, 4.0]))


def test_flow_grpo_factory_loads_a_bundle_path_once_on_the_device_it_is_given(demo, monkeypatch):
    from nvrm.cli.demo import demo_bundle_path

    model, ctx, cands = demo
    loads = []
    real = RewardModel.from_pretrained

    def spy(path, **kw):
        loads.append(kw.get("device"))
        return real(path, **kw)

    monkeypatch.setattr(RewardModel, "from_pretrained", staticmethod(spy))
    factory = flow_grpo_reward(str(demo_bundle_path()), fps=4.0)
    first, second = factory("cpu"), factory("cpu")
    meta = [{"context_video": str(ctx)}]
    assert first([str(cands["smooth"])], [PROMPT], meta)[0] == second([str(cands["smooth"])], [PROMPT], meta)[0]
    assert first([str(cands["smooth"])], [PROMPT], meta)[0] == [model.score_group(PROMPT, ctx, [cands["smooth"]])[0].reward]
    assert loads == ["cpu"]


def test_a_bad_on_error_is_a_config_error_naming_the_value(demo):
    from nvrm.errors import ConfigError

    model, _, _ = demo
    for make in (verl_compute_score, flow_grpo_reward):
        with pytest.raises(ConfigError, match="on_error='skip'"):
            make(model, on_error="skip")
        with pytest.raises(ConfigError, match="on_error=True"):
            make(model, on_error=True)
