"""Reward adapters at the trainers' own call sites, on the shipped demo model.

- TRL is installed by the test extra: its ``GRPOTrainer`` runs one real step and calls the adapter on
  its own reward path (``_calculate_rewards``).
- flow-GRPO is not a package: ``FlowGrpoHarness`` reproduces its call site, written here from
  ``flow_grpo/rewards.py`` (``multi_score``) and ``scripts/train_wan2_1.py`` (executor, advantages).
- verl needs transformers 5, so it cannot share this environment: ``load_like_verl`` reproduces
  ``verl/trainer/ppo/reward.py`` ``get_custom_reward_fn`` (the file loaded by path, ``getattr(module,
  name)``, ``reward_kwargs`` bound with ``functools.partial``) and the reward loop's concurrent
  per-sample calls (``run_in_executor`` per sample, gathered).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import math
import warnings
from concurrent import futures

import numpy as np
import pytest
import torch

from nvrm import Clip, RewardModel
from nvrm.errors import ConfigError, RewardFnError, ZeroSignalWarning
from nvrm.rl import Normalize, batched, flow_grpo_reward, trl_reward, verl_compute_score
from nvrm.synth.clips import moving_square

PROMPT = "A square glides across a tiled floor at constant speed."


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


def renderer(cands):
    """A stand-in world model: what the policy wrote picks the continuation (by its characters)."""
    order = ["smooth", "frozen", "reversed", "teleport", "flicker"]

    def render(prompt, completion, **row):
        assert "context_video" in row  # the hook sees the dataset row
        return str(cands[order[sum(map(ord, completion)) % len(order)]])

    return render


# ---------------------------------------------------------------- TRL


def trl_trainer(model, ctx, tmp_path, reward, rows, steps=1):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    policy, tok = tiny_policy()
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=6, max_steps=steps,
                      logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", beta=0.0, dataloader_num_workers=0,
                      temperature=1.5, seed=3)
    return GRPOTrainer(model=policy, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)


def test_trl_grpo_step_with_a_render_hook_gets_reward_variance(demo, tmp_path):
    import trl

    model, ctx, cands = demo
    assert trl.__version__ == "1.16.0"
    reward = trl_reward(model, render=renderer(cands))
    rows = [{"prompt": "a square moves", "context_video": str(ctx)}] * 4
    trainer = trl_trainer(model, ctx, tmp_path, reward, rows)
    trainer.train()  # one real GRPO step: generation, then the adapter on TRL's own reward path
    [step] = [h for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(step["rewards/nvrm_reward/mean"])
    assert step["reward_std"] > 0 and step["frac_reward_zero_std"] < 1.0  # the reward follows the policy
    assert step["nvrm_reward/failed_fraction"] == 0.0


def test_trl_reward_path_scores_groups_and_fails_items_as_none(demo, tmp_path):
    model, ctx, cands = demo
    def render(prompt, completion, **row):
        if completion == "w":
            raise RuntimeError("the world model ran out of memory")
        return str(cands[{"x": "smooth", "y": "frozen", "z": "reversed"}[completion]])

    reward = trl_reward(model, render=render)
    trainer = trl_trainer(model, ctx, tmp_path, reward, [{"prompt": "p", "context_video": str(ctx)}] * 4)
    inputs = [{"prompt": PROMPT, "context_video": str(ctx)}] * 4
    got = trainer._calculate_rewards(inputs, [PROMPT] * 4, ["x", "y", "z", "w"], [[3], [4], [5], [6]])
    want = [r.reward for r in model.score_group(PROMPT, ctx, [cands["smooth"], cands["frozen"], cands["reversed"]])]
    assert got.shape == (4, 1)
    assert got[:3, 0].tolist() == pytest.approx(want, abs=1e-6)  # float32 of the bf16 rewards
    assert math.isnan(got[3, 0].item())  # None -> NaN: left out of the group's statistics, never 0.0


def test_trl_reward_from_a_column_warns_that_it_ignores_the_policy(demo):
    model, ctx, cands = demo
    fn = trl_reward(model, candidate_key="candidate_video", name="column_reward")
    with pytest.warns(ZeroSignalWarning, match="same input.*render="):
        out = fn(prompts=[PROMPT] * 2, completions=["a", "b"], context_video=[str(ctx)] * 2, candidate_video=[str(cands["smooth"])] * 2)
    assert out[0] == out[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per run, not once per step
        fn(prompts=[PROMPT] * 2, completions=["a", "b"], context_video=[str(ctx)] * 2, candidate_video=[str(cands["smooth"])] * 2)


def test_trl_prompt_and_context_keys_are_used_or_refused(demo):
    model, ctx, cands = demo
    paths = [str(cands["smooth"]), str(cands["frozen"])]
    fn = trl_reward(model, prompt_key="prompt")  # TRL removes the "prompt" column: it is the prompts argument
    assert fn(prompts=[PROMPT] * 2, completions=paths, context_video=[str(ctx)] * 2) == [
        r.reward for r in model.score_group(PROMPT, ctx, paths)]
    with pytest.raises(ConfigError, match="prompt_key='reward_prompt'.*context_video"):
        trl_reward(model, prompt_key="reward_prompt")(prompts=[PROMPT], completions=paths[:1], context_video=[str(ctx)])
    with pytest.raises(ConfigError, match="context_key='context_video'"):
        trl_reward(model)(prompts=[PROMPT], completions=paths[:1])
    with pytest.raises(ConfigError, match="render="):  # the policy wrote text, not paths
        trl_reward(model)(prompts=[PROMPT] * 2, completions=["go left", "go right"], context_video=[str(ctx)] * 2)
    out = trl_reward(model)(prompts=[PROMPT, None], completions=paths, context_video=[str(ctx), str(ctx)])
    assert out[0] is not None and out[1] is None  # a missing prompt fails its row; it is never scored as ""
    with pytest.raises(ConfigError, match="2 prompts for 1 completions"):
        trl_reward(model)(prompts=[PROMPT] * 2, completions=paths[:1], context_video=[str(ctx)])


def test_trl_batched_render_hook(demo):
    model, ctx, cands = demo
    seen = []

    @batched
    def render(prompts, completions, rows):
        seen.append(len(completions))
        return [str(cands["smooth"] if c.startswith("s") else cands["frozen"]) for c in completions]

    out = trl_reward(model, render=render)(prompts=[PROMPT] * 3, completions=["s1", "f", "s2"], context_video=[str(ctx)] * 3)
    assert seen == [3] and out[0] == out[2] and out[0] > out[1]


# ---------------------------------------------------------------- flow-GRPO


class FlowGrpoHarness:
    """flow-GRPO's reward call site, reproduced (not imported: flow-GRPO is not a package).

    - ``flow_grpo/rewards.py`` ``multi_score(device, score_dict)``: calls each factory with ``device``,
      then ``scores, rewards = fn(images, prompts, metadata)`` and keeps only ``scores``, weighted,
      summed into ``avg``.
    - ``scripts/train_wan2_1.py``: a ``ThreadPoolExecutor(max_workers=8)``; every sampling batch is
      submitted as ``executor.submit(reward_fn, videos, prompts, prompt_metadata, only_strict=True)``
      before any ``.result()``; rewards become ``torch.as_tensor(..., device=device).float()``.
    - ``flow_grpo/stat_tracking.py`` ``PerPromptStatTracker.update``: per prompt, float64,
      ``(r - mean) / (np.std(r) + 1e-4)``, with no NaN handling.
    """

    def __init__(self, factories: dict, device="cpu"):
        self.device = device
        self.fns = {name: (factory(device), weight) for name, (factory, weight) in factories.items()}

    def multi_score(self, images, prompts, metadata, only_strict=True):
        details, total = {}, [0.0] * len(prompts)
        for name, (fn, weight) in self.fns.items():
            scores, _ = fn(images, prompts, metadata)  # flow-GRPO drops the second value
            details[name] = scores
            total = [t + weight * s for t, s in zip(total, scores)]
        details["avg"] = total
        return details, {}

    def step(self, batches):
        with futures.ThreadPoolExecutor(max_workers=8) as executor:
            pending = [executor.submit(self.multi_score, v, p, m, only_strict=True) for v, p, m in batches]
            results = [f.result() for f in pending]
        prompts = [p for _, ps, _ in batches for p in ps]
        rewards = np.concatenate([torch.as_tensor(r["avg"], device=self.device).float().cpu().numpy() for r, _ in results]).astype(np.float64)
        advantages = np.empty_like(rewards)
        for prompt in set(prompts):
            idx = [i for i, p in enumerate(prompts) if p == prompt]
            r = rewards[idx]
            advantages[idx] = (r - np.mean(r)) / (np.std(r) + 1e-4)
        return rewards, advantages, results


def wan_videos(n, frames=81, fps=16, h=48, w=64, seed=0):
    """[B, T, C, H, W] float32 in [0, 1], as Wan's pipeline returns them (``output_type="pt"``)."""
    vids = [torch.from_numpy(moving_square(frames, h, w, seed=seed + i, speed=1 + i % 3)).permute(0, 3, 1, 2).float() / 255 for i in range(n)]
    return torch.stack(vids)


def test_flow_grpo_eight_concurrent_batches_match_one_at_a_time(demo):
    model, ctx, _ = demo
    meta = [{"context_video": str(ctx)}] * 4
    batches = [(wan_videos(4, seed=10 * k), [f"prompt {k % 3}"] * 4, meta) for k in range(8)]
    harness = FlowGrpoHarness({"nvrm": (flow_grpo_reward(model), 1.0)})
    rewards, advantages, _ = harness.step(batches)
    alone = FlowGrpoHarness({"nvrm": (flow_grpo_reward(model), 1.0)})
    one_at_a_time = np.concatenate([alone.multi_score(*b)[0]["avg"] for b in batches])
    assert rewards.tolist() == one_at_a_time.tolist()
    assert np.isfinite(advantages).all() and np.ptp(rewards) > 0
    # the candidate is the 81-frame video at 16 fps, sampled at t = 0..4 s, like the same frames in memory
    frames = (wan_videos(1, seed=0)[0].permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
    assert rewards[0] == model.score("prompt 0", ctx, Clip(frames, 16)).reward


def test_flow_grpo_one_failure_never_turns_a_prompts_advantages_into_nan(demo):
    model, ctx, _ = demo
    videos = wan_videos(4)
    videos[2, 5] = float("nan")  # one broken sample
    meta = [{"context_video": str(ctx)}] * 4
    harness = FlowGrpoHarness({"nvrm": (flow_grpo_reward(model, on_error="group_mean"), 1.0)})
    rewards, advantages, results = harness.step([(videos, [PROMPT] * 4, meta)])
    assert np.isfinite(advantages).all()
    assert advantages[2] == pytest.approx(0.0, abs=1e-4)  # at its prompt's mean (up to the trainer's float32)
    assert rewards[2] == pytest.approx(np.mean(rewards[[0, 1, 3]]))
    fn = flow_grpo_reward(model, on_error="group_mean")("cpu")
    scores, info = fn(videos, [PROMPT] * 4, meta)
    assert info["nvrm_failed"] == [2] and "NaN" in info["nvrm_errors"][2]
    with pytest.raises(RewardFnError, match="NaN"):  # the default: a failure is raised, never filled
        flow_grpo_reward(model)("cpu")(videos, [PROMPT] * 4, meta)


def test_flow_grpo_wan_recipe_lengths_and_short_candidate_opt_in(demo):
    model, ctx, _ = demo
    meta = [{"context_video": str(ctx)}] * 2
    short = wan_videos(2, frames=33)  # the Wan recipe's 33 frames at 16 fps: 2.06 s
    with pytest.raises(RewardFnError, match=r"2\.06 s.*80 frames at 16 fps.*short_candidates=True"):
        flow_grpo_reward(model)("cpu")(short, [PROMPT] * 2, meta)
    from nvrm import Contract
    from nvrm.cli.demo import demo_bundle_path

    scores, info = flow_grpo_reward(str(demo_bundle_path()), short_candidates=True)("cpu")(short, [PROMPT] * 2, meta)
    assert info["nvrm_failed"] == [] and all(math.isfinite(s) for s in scores)
    assert info["nvrm_off_contract"] == [["short candidate: 3 of 5 frames"]] * 2  # flagged in every result
    relaxed = RewardModel.from_pretrained(demo_bundle_path(), device="cpu", contract=Contract(short_candidates=True))
    assert relaxed.fingerprint != model.fingerprint  # off-contract rewards never pass as the release's
    full = wan_videos(2)
    assert flow_grpo_reward(relaxed)("cpu")(full, [PROMPT] * 2, meta)[1]["nvrm_off_contract"] == [[], []]
    with pytest.raises(ConfigError, match="short_candidates=True"):
        flow_grpo_reward(model, short_candidates=True)("cpu")


def test_flow_grpo_bad_items_fail_alone(demo):
    model, ctx, _ = demo
    fn = flow_grpo_reward(model, on_error=-5.0)("cpu")
    good = wan_videos(1)[0]
    videos = [good, good.double(), good[0], (good * 255).to(torch.int32), good, good]
    metas = [{"context_video": str(ctx)}] * 4 + [{"context_video": str(ctx), "fps": "abc"}, {}]
    with pytest.warns(ZeroSignalWarning):  # the two good items are the same video: equal rewards
        scores, info = fn(videos, [PROMPT] * 6, metas)
    assert info["nvrm_failed"] == [2, 3, 4, 5]
    assert scores[0] == scores[1] != -5.0  # float64 frames score like float32 ones
    assert scores[2:] == [-5.0] * 4
    errors = info["nvrm_errors"]
    assert "shape" in errors[2] and "int32" in errors[3] and "'abc'" in errors[4] and "'context_video'" in errors[5]
    with pytest.raises(ConfigError, match="3 videos, 2 prompts"):
        fn([good] * 3, [PROMPT] * 2, metas[:2])
    with pytest.raises(ConfigError, match="on_error=nan"):
        flow_grpo_reward(model, on_error=float("nan"))


# ---------------------------------------------------------------- verl


def load_like_verl(name, reward_kwargs):
    """``get_custom_reward_fn``: load nvrm/rl/verl.py by path, ``getattr(module, name)``, bind reward_kwargs."""
    import nvrm.rl.verl as installed

    spec = importlib.util.spec_from_file_location(f"custom_module_{abs(hash(installed.__file__))}", installed.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = getattr(module, name)
    return functools.partial(lambda fn, kw, *a, **k: fn(*a, **{**k, **kw}), raw, dict(reward_kwargs))


def naive_reward_loop(fn, samples):
    """verl 0.9's reward loop: one task per sample, sync functions in the default executor, gathered."""
    async def run():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*[
            loop.run_in_executor(None, functools.partial(fn, data_source="video", solution_str=s, ground_truth=None, extra_info=info))
            for s, info in samples])
    return asyncio.run(run())


def test_verl_per_sample_calls_share_one_model_and_one_group(demo, monkeypatch):
    from nvrm.cli.demo import demo_bundle_path
    import nvrm.source.reward_source as scorer

    model, ctx, cands = demo
    loads, groups = [], []
    real = RewardModel.from_pretrained
    monkeypatch.setattr(scorer, "_MODELS", {})
    monkeypatch.setattr(scorer, "_REGISTRY", {})
    monkeypatch.setattr(RewardModel, "from_pretrained", staticmethod(lambda path, **kw: loads.append(path) or real(path, **kw)))
    kwargs = {"model": str(demo_bundle_path()), "device": "cpu", "coalesce_ms": 200}
    first = load_like_verl("compute_score", kwargs)
    second = load_like_verl("compute_score", kwargs)  # main_ppo builds the manager twice
    info = {"prompt": PROMPT, "context_video": str(ctx)}
    samples = [(str(cands[n]), info) for n in ("smooth", "frozen", "reversed", "teleport")]
    real_groups = RewardModel.score_groups
    monkeypatch.setattr(RewardModel, "score_groups", lambda self, gs, **k: real_groups(self, [g for g in gs if groups.append(len(g[2])) or True], **k))
    out = naive_reward_loop(first, samples)
    assert loads == [str(demo_bundle_path())]
    assert groups == [4]  # the four concurrent per-sample calls scored as one group
    want = [r.reward for r in model.score_group(PROMPT, ctx, [s for s, _ in samples])]
    assert [o["score"] for o in out] == want and all(o["nvrm_ok"] == 1.0 for o in out)
    assert naive_reward_loop(second, samples[:1])[0]["score"] == want[0]
    assert loads == [str(demo_bundle_path())]  # still one model in the process


def test_verl_batch_function_is_found_by_name_and_settings_are_honoured(demo):
    model, ctx, cands = demo
    info = {"prompt": PROMPT, "context_video": str(ctx)}
    fn = load_like_verl("compute_score_batch", {"model": model_path(), "on_error": -1.0, "device": "cpu"})
    out = fn(data_sources=["v"] * 3, solution_strs=[str(cands["smooth"]), "/no/such.mp4", str(cands["frozen"])],
             ground_truths=[None] * 3, extra_infos=[info, info, {"context_video": str(ctx)}])
    assert out[0]["nvrm_ok"] == 1.0 and out[0]["score"] == model.score(PROMPT, ctx, cands["smooth"]).reward
    assert out[0]["nvrm_revision"] == model.revision  # which revision scored the step (verl's reward_extra_info)
    # the demo bundle has a guard: every sample's dict has the same keys (verl's reward_extra_info), a failed one NaN
    assert out[0]["nvrm_raw_reward"] == out[0]["score"] and out[0]["nvrm_uncertainty"] >= 0
    failed = dict(out[1])
    assert math.isnan(failed.pop("nvrm_raw_reward")) and math.isnan(failed.pop("nvrm_uncertainty"))
    assert failed == {"score": -1.0, "nvrm_ok": 0.0, "nvrm_off_contract": 0.0, "nvrm_revision": ""}
    assert out[2]["nvrm_ok"] == 0.0  # no prompt: refused, never scored as an empty prompt
    with pytest.raises(ConfigError, match="unknown setting.*temperature"):
        load_like_verl("compute_score_batch", {"model": model_path(), "temperature": 0.7})(
            data_sources=["v"], solution_strs=["x"], ground_truths=[None], extra_infos=[info])


def test_verl_batch_takes_numpy_columns_and_refuses_columns_of_other_lengths(demo):
    """verl's BatchRewardManager passes numpy object arrays (their truth value is ambiguous)."""
    import numpy as np

    model, ctx, cands = demo
    info = {"prompt": PROMPT, "context_video": str(ctx)}
    fn = load_like_verl("compute_score_batch", {"model": model_path(), "device": "cpu"})
    sols = [str(cands["smooth"]), str(cands["frozen"])]
    out = fn(data_sources=np.array(["v", "v"], dtype=object), solution_strs=sols, ground_truths=[None, None],
             extra_infos=np.array([info, info], dtype=object))
    assert [o["score"] for o in out] == [r.reward for r in model.score_group(PROMPT, ctx, sols)]
    for kw, said in [({"extra_infos": np.array([info], dtype=object)}, "2 solution_strs but 1 extra_infos"),
                     ({"data_sources": ["v"] * 3}, "2 solution_strs but 3 data_sources")]:
        args = {"data_sources": ["v", "v"], "solution_strs": sols, "ground_truths": [None, None], "extra_infos": [info, info], **kw}
        with pytest.raises(ConfigError, match=said):
            fn(**args)
        with pytest.raises(ConfigError, match=said):
            verl_compute_score(model).batch(**args)


def model_path():
    from nvrm.cli.demo import demo_bundle_path

    return str(demo_bundle_path())


def test_verl_missing_prompt_names_the_key_and_a_retry_is_not_scored_twice(demo, monkeypatch):
    model, ctx, cands = demo
    fn = verl_compute_score(model)
    calls = []
    real = model.score_groups
    monkeypatch.setattr(model, "score_groups", lambda gs, **k: calls.append(1) or real(gs, **k))
    with pytest.raises(RewardFnError, match=r"extra_info\['prompt'\]"):
        fn(data_source="v", solution_str=str(cands["smooth"]), ground_truth=None, extra_info={"context_video": str(ctx)})
    infos = [{"prompt": PROMPT, "context_video": str(ctx)}] * 2
    batch = (["v"] * 2, [str(cands["smooth"]), "/no/such.mp4"], [None] * 2, infos)
    with pytest.raises(RewardFnError, match="1 of 2") as first:
        fn.batch(*batch)
    n = len(calls)
    with pytest.raises(RewardFnError) as again:  # verl's except-and-call-again
        fn.batch(*batch)
    assert len(calls) == n and str(again.value) == str(first.value)


def test_verl_rollouts_sharing_extra_info_follow_the_solution(demo):
    """The n rollouts of a prompt share one extra_info: the candidate must come from solution_str."""
    model, ctx, cands = demo
    info = {"prompt": PROMPT, "context_video": str(ctx), "candidate_video": str(cands["smooth"])}
    column = verl_compute_score(model, candidate_key="candidate_video")
    with pytest.warns(ZeroSignalWarning):
        flat = column.batch(["v"] * 2, ["a", "b"], [None] * 2, [info] * 2)
    assert flat[0]["score"] == flat[1]["score"]
    follow = verl_compute_score(model, render=lambda prompt, solution, **info: str(cands["smooth" if solution == "a" else "frozen"]))
    out = follow.batch(["v"] * 2, ["a", "b"], [None] * 2, [info] * 2)
    assert out[0]["score"] > out[1]["score"]


# ---------------------------------------------------------------- shared pieces


def test_normalisation_is_off_by_default_and_keeps_failures():
    assert not Normalize().active and Normalize()([1.0, None], [[0, 1]]) == [1.0, None]
    out = Normalize(group_whiten=True)([1.0, 3.0, None, 10.0, 10.0], [[0, 1, 2], [3, 4]])
    assert out[0] == pytest.approx(-1.0, abs=1e-5) and out[1] == pytest.approx(1.0, abs=1e-5) and out[2] is None
    assert out[3] == out[4] == 0.0
    assert Normalize(clip=0.5)([2.0, -3.0, 0.1, None], []) == [0.5, -0.5, 0.1, None]
    run = Normalize(running=True)
    run([0.0, 2.0], [])
    later = run([4.0], [])
    assert run.stats.n == 3 and later[0] == pytest.approx((4.0 - 2.0) / (math.sqrt(8 / 3) + 1e-6))
    for bad in ({"clip": float("nan")}, {"clip": -1}, {"eps": 0}, {"eps": float("inf")}):
        with pytest.raises(ConfigError, match=str(list(bad)[0])):
            Normalize(**bad)


def test_a_bad_on_error_is_a_config_error_naming_the_value(demo):
    model, _, _ = demo
    for make in (verl_compute_score, flow_grpo_reward, trl_reward):
        with pytest.raises(ConfigError, match="on_error='skip'"):
            make(model, on_error="skip")
        with pytest.raises(ConfigError, match="on_error=True"):
            make(model, on_error=True)


# ---------------------------------------------------------------- one rule for every adapter


def test_group_mean_and_empty_prompts_are_one_rule_through_every_adapter(demo):
    """The same call through make_reward_fn, TRL, verl and flow-GRPO: a failed slot gets the mean of its
    own group's scored items (same prompt and context), and an empty prompt is refused, never scored."""
    from nvrm import make_reward_fn

    model, ctx, cands = demo
    other = "A square drifts slowly to the left."
    prompts = [PROMPT, PROMPT, PROMPT, other, other, other, "  "]
    videos = [str(cands["smooth"]), "/no/such.mp4", str(cands["frozen"]), str(cands["teleport"]), str(cands["reversed"]), "/no/such.mp4", str(cands["smooth"])]
    contexts = [str(ctx)] * len(prompts)
    g1 = [r.reward for r in model.score_group(PROMPT, ctx, [videos[0], videos[2]])]
    g2 = [r.reward for r in model.score_group(other, ctx, [videos[3], videos[4]])]
    scored = g1 + g2
    want = [g1[0], sum(g1) / 2, g1[1], g2[0], g2[1], sum(g2) / 2, sum(scored) / len(scored)]

    outs = {"make_reward_fn": make_reward_fn(model, on_error="group_mean")(prompts, contexts, videos)}
    trl = trl_reward(model, on_error="group_mean")
    outs["trl"] = trl(prompts=prompts, completions=videos, context_video=contexts)
    infos = [{"prompt": p, "context_video": c} for p, c in zip(prompts, contexts)]
    outs["verl"] = [o["score"] for o in verl_compute_score(model, on_error="group_mean").batch(["v"] * len(prompts), videos, [None] * len(prompts), infos)]
    scores, info = flow_grpo_reward(model, on_error="group_mean")()(videos, prompts, [{"context_video": c} for c in contexts])
    outs["flow_grpo"] = scores
    assert info["nvrm_failed"] == [1, 5, 6] and "empty" in info["nvrm_errors"][6]
    for name, got in outs.items():
        assert got == want, name
    with pytest.raises(RewardFnError, match=r"item 0: the prompt \(prompts\[i\]\) is empty"):
        make_reward_fn(model)(prompts[-1:], contexts[-1:], videos[-1:])
