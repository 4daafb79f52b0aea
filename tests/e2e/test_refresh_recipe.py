"""The refresh recipe (docs/refresh.md, "The recipe") as a test: an RL-like loop on the synthetic moving-square task
against a real ``nvrm serve --record`` of the shipped demo model, two ``nvrm refresh`` cycles, each swapped into
the running server (``--serve``) when its gate passes, and the hack's reward measured before and after.

The hack: the demo model over-rewards the right motion with its colour taken away ("gray"): measured on 8 held-out
examples, +4.96 above the preferred continuation on average, above it on 8 of 8 (the reason it is the recipe's
hackable variant; a 2x speed-up, a channel swap, a mirror or an upside-down flip are not over-rewarded on average).

THE JUDGE IS AN ORACLE, not a vision-language model: a tiny OpenAI-compatible chat server that answers from the
synthetic task's ground truth (preferred > gray > reverse > freeze). It recognises each video it is shown by its
images: the oracle matches each recorded candidate's frames to the nearest ground-truth variant it generated, then
turns the cycle's video of it into the very data URLs the cycle sends (the judge contract), and looks those up.
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import Server
from nvrm import Clip
from nvrm.cli.demo import demo_bundle_path
from nvrm.cli.main import main
from nvrm.client import RewardClient
from nvrm.contract import Contract
from nvrm.errors import RefreshError
from nvrm.prefs.judge_contract import JudgeContract, video_images
from nvrm.prefs.synthetic import PROMPT, SynthSpec, make_example
from nvrm.record.reader import load_frames, read_rows
from nvrm.refresh.gate import failure_line
from nvrm.refresh.swap import bundle_revision, swap_into
from nvrm.video.inputs import sample_input
from test_refresh import serve_oracle, shown_videos  # the same OpenAI-shaped answer around an oracle

pytestmark = pytest.mark.slow

KINDS = ("preferred", "gray", "reverse", "freeze")
QUALITY = {"preferred": 3, "gray": 2, "reverse": 1, "freeze": 0}
"""The oracle's ground truth: the right motion in colour, the right motion without its colour, then wrong motion."""
SPEC = SynthSpec()
CONTRACT = JudgeContract(max_context_frames=0)
ADMIN = "NVRM_RECIPE_ADMIN_KEY"
CONTEXTS_PER_STEP, GROUP, STEPS = 4, 3, 2
EVAL_SEEDS = range(900_000, 900_004)


def variants(seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One example's context and its candidates of every kind ("gray": the preferred continuation without colour)."""
    ex = make_example(seed, SPEC)
    gray = np.repeat(ex["preferred"].mean(-1, keepdims=True).astype(np.uint8), 3, axis=-1)
    return ex["context"], {"preferred": ex["preferred"], "gray": gray, "reverse": ex["reverse"], "freeze": ex["freeze"]}


class Oracle:
    """Answers ``{"winner": ...}`` from the ground truth of the two videos it is shown (see the module doc)."""

    def __init__(self, record: Path):
        self.record, self.cycle, self.table, self.asked = record, None, None, 0
        self.refs: dict[tuple[int, str], np.ndarray] = {}

    def know(self, seed: int) -> None:
        """Remember the ground truth of ``seed``'s candidates, sampled as the server samples them."""
        for kind, frames in variants(seed)[1].items():
            images, _, _ = sample_input(Clip(frames, fps=SPEC.fps), "candidate", Contract())
            self.refs[(seed, kind)] = np.stack([np.asarray(im, dtype=np.int16) for im in images])

    def kind_of(self, frames: np.ndarray) -> str:
        frames = frames.astype(np.int16)
        best = min((float(np.mean((ref - frames) ** 2)), kind) for (_, kind), ref in self.refs.items() if ref.shape == frames.shape)
        assert best[0] < 20.0, f"a recorded candidate matches no ground truth (nearest MSE {best[0]:.1f})"
        return best[1]

    def use(self, cycle: Path) -> None:
        self.cycle, self.table = cycle, None

    def quality(self, urls: tuple[str, ...]) -> int:
        if self.table is None:  # built on the first question, once the cycle has written its videos
            rows, _ = read_rows(self.record)
            kind = {r["candidate"]["key"]: self.kind_of(load_frames(self.record, r["candidate"])) for r in rows}
            self.table = {tuple(video_images(str(p), "candidate", CONTRACT)): QUALITY[kind[p.stem]]
                          for p in (self.cycle / "record" / "media").glob("*.mp4") if p.stem in kind}
        return self.table[urls]

    def answer(self, body: dict) -> str:
        first, second = (self.quality(v) for v in shown_videos(body))
        self.asked += 1
        return "first" if first > second else "second" if second > first else "tie"


class Policy:
    """The RL stand-in: a softmax over the candidate kinds, sampling a group of distinct kinds per context and moving
    toward the kinds the reward ranks above its group's mean (a group-relative policy gradient)."""

    def __init__(self, lr: float = 0.3, seed: int = 0):
        self.logits, self.lr, self.rng = np.zeros(len(KINDS)), lr, np.random.default_rng(seed)

    def probs(self) -> np.ndarray:
        e = np.exp(self.logits - self.logits.max())
        return e / e.sum()

    def sample(self) -> list[int]:
        gumbel = self.logits - np.log(-np.log(self.rng.uniform(size=len(KINDS))))
        return list(np.argsort(-gumbel)[:GROUP])

    def update(self, picks: list[int], rewards: list[float]) -> None:
        adv = np.array(rewards) - np.mean(rewards)
        adv = adv / (np.std(rewards) + 1e-6)
        for k, a in zip(picks, adv):
            self.logits[k] += self.lr * a


def rollouts(client: RewardClient, policy: Policy, oracle: Oracle, first_seed: int) -> set[str]:
    """STEPS steps of CONTEXTS_PER_STEP fresh contexts, GROUP candidates each, scored (and recorded) by the server;
    returns the revisions the rewards carried."""
    revisions = set()
    for step in range(STEPS):
        for i in range(CONTEXTS_PER_STEP):
            seed = first_seed + step * CONTEXTS_PER_STEP + i
            oracle.know(seed)
            context, cands = variants(seed)
            picks = policy.sample()
            results = client.score_group(PROMPT, Clip(context, fps=SPEC.fps), [Clip(cands[KINDS[k]], fps=SPEC.fps) for k in picks])
            policy.update(picks, [r.reward for r in results])
            revisions |= {r.model_revision for r in results}
    return revisions


def hack_margin(bundle: Path) -> float:
    """A model's mean reward of the hack minus that of the true best, over fresh examples (in process: kept out of the record)."""
    from nvrm import RewardModel

    margins = []
    with RewardModel.from_pretrained(bundle, device="cpu") as model:
        for seed in EVAL_SEEDS:
            context, cands = variants(seed)
            pref, gray = model.score_group(PROMPT, Clip(context, fps=SPEC.fps), [Clip(cands[k], fps=SPEC.fps) for k in ("preferred", "gray")])
            margins.append(gray.reward - pref.reward)
    return float(np.mean(margins))


def wait_for_rows(record: Path, n: int) -> list[dict]:
    """The record's rows once the server's writer has written ``n`` of them (it writes off the request path)."""
    deadline = time.monotonic() + 60
    while True:
        rows = read_rows(record)[0] if (record / "record.json").is_file() else []
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_two_refresh_cycles_lower_the_hacks_reward(tmp_path, capsys):
    t0 = time.monotonic()
    record, cycles = tmp_path / "record", tmp_path / "cycles"
    cycles.mkdir()
    server = Server(demo_bundle_path(), "--record", record, "--admin-key-env", ADMIN, "--allow-dir", cycles, env={ADMIN: "recipe-admin"})
    oracle = Oracle(record)
    judge, judge_url = serve_oracle(oracle)
    os.environ[ADMIN] = "recipe-admin"
    try:
        client = RewardClient(server.url)
        policy = Policy()
        bundles, reports, served = [demo_bundle_path()], [], []
        for cycle in (1, 2):
            served.append(rollouts(client, policy, oracle, first_seed=1000 * cycle))
            assert len(served[-1]) == 1  # one revision served while the policy rolled out
            rows = wait_for_rows(record, cycle * STEPS * CONTEXTS_PER_STEP * GROUP)
            assert len(rows) == cycle * STEPS * CONTEXTS_PER_STEP * GROUP
            print(f"after {STEPS * cycle} RL steps: policy {dict(zip(KINDS, policy.probs().round(3).tolist()))}")
            folder = cycles / str(cycle)
            oracle.use(folder)
            rc = main(["refresh", "--record", str(record), "--from", str(bundles[-1]), "--cycle", str(folder), "--judge", judge_url,
                       "--pairs-per-cycle", "16", "--holdout", "0.25", "--max-context-frames", "0",
                       "--epochs", "4", "--batch-pairs", "4", "--lr", "2e-4", "--warmup-steps", "0", "--lora-rank", "4",
                       "--probe-contexts", "2", "--probe-perturbations", "freeze,reverse,shift,blur", "--device", "cpu",
                       "--serve", server.url, "--admin-key-env", ADMIN])
            out = capsys.readouterr()
            print(out.out, out.err[-3000:])
            report = json.loads((folder / "gate" / "gate.json").read_text())
            reports.append(report)
            if cycle == 1 or report["passed"]:
                assert rc == 0 and report["passed"], failure_line(report)
                swap = json.loads((folder / "export" / "swap.json").read_text())
                assert swap["previous_revision"] == next(iter(served[-1])) and swap["revision"] != swap["previous_revision"]
                bundles.append(folder / "export" / "bundle")
            else:  # the gate refused the second candidate: nothing exported or swapped, the server keeps the first cycle's model
                assert rc == 1 and not (folder / "export" / "bundle").exists() and not (folder / "export" / "swap.json").exists()
                print(f"cycle 2: the gate refused its candidate: {failure_line(report)}")
        after = client.score_group(PROMPT, Clip(variants(5)[0], fps=SPEC.fps), [Clip(variants(5)[1]["preferred"], fps=SPEC.fps)])
        assert served[1] == {json.loads((cycles / "1" / "export" / "swap.json").read_text())["revision"]}  # cycle 2's rollouts
        assert after[0].model_revision == swap["revision"]  # every reward from then on carries the served revision
        rows = wait_for_rows(record, 2 * STEPS * CONTEXTS_PER_STEP * GROUP + 1)
        # the record stamps each row with the revision that scored it (the bundle's own revision, as in process)
        per_phase = [bundle_revision(demo_bundle_path()), json.loads((cycles / "1" / "export" / "swap.json").read_text())["bundle_revision"]]
        assert per_phase[0] and per_phase[1] and per_phase[0] != per_phase[1]
        assert [r["revision"] for r in rows] == [rev for rev in per_phase for _ in range(STEPS * CONTEXTS_PER_STEP * GROUP)] + [swap["bundle_revision"]]
        os.environ[ADMIN] = "not-the-admin-key"  # a refused swap is one line with the server's reason, and changes nothing
        with pytest.raises(RefreshError, match="was refused: 403"):
            swap_into(server.url, bundles[0], admin_key_env=ADMIN)
        assert client.score_group(PROMPT, Clip(variants(6)[0], fps=SPEC.fps), [Clip(variants(6)[1]["gray"], fps=SPEC.fps)])[0].model_revision \
            == swap["revision"]
        for i, report in enumerate(reports, 1):
            held = report["checks"]["holdout"]
            print(f"cycle {i}: held-out agreement current {held['current']['accuracy']:.3f} -> candidate {held['candidate']['accuracy']:.3f} "
                  f"(n {held['candidate']['n']}); probe: {report['checks']['probe']['why']}")
            assert held["candidate"]["accuracy"] >= held["current"]["accuracy"] or not report["passed"]
        margins = [hack_margin(b) for b in bundles]
        print("hack margin (gray - preferred, mean reward over 4 fresh examples), base -> each exported cycle: "
              + " -> ".join(f"{m:+.3f}" for m in margins))
        print(f"recipe took {time.monotonic() - t0:.0f} s; judge asked {oracle.asked} times")
        assert margins[-1] < margins[0], margins
    finally:
        judge.shutdown()
        server.stop()
        os.environ.pop(ADMIN, None)
