"""Bradley-Terry training of the reward model with LoRA, on one process or many (Accelerate).

One code path with scoring: pairs go through the model's engine (the contract) and rewards through
``RewardForward`` (the scoring forward, wrapped whole by DDP). The vision tower and the base
language-model weights stay frozen; LoRA adapters (peft) on the language model and the whole head
are trained. The parts:

- ``dist.Ranks``: the processes of the run and their collectives;
- ``adapters``: what is trained (LoRA adapters, the head) and the optimizer over it;
- ``data``: the global plan (which pairs, which rank) and the feed (files, memory or a store);
- ``loop.Loop``: one optimizer step on every rank; ``schedule``: the learning rate and the tie margin;
- ``held_out``: evaluation on every rank; ``run_log``: ``metrics.jsonl`` and the progress lines;
- ``checkpoint``: safetensors checkpoints in global units (resume at any world size);
- ``export``: the merged model as a release-layout bundle.

``Trainer`` holds the run's state (model, adapters, optimizer, feed, progress) and drives the epochs over these.

Only rank 0 writes files (metrics, checkpoints, the export, the summary); the others wait for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

import torch

from ..errors import InputError, TrainingError
from ..forward.model import DTYPES
from ..prefs.pairs import Pair, PairProblem, read_pairs
from ..scoring.reward_model import RewardModel
from . import checkpoint
from .adapters import add_lora, make_optimizer, trainable_head
from .config import TrainConfig
from .data import Feed, StepPlan, pair_videos, pairs_digest
from .dist import Ranks
from .held_out import evaluate_on_ranks
from .loop import Loop, Progress
from .reward_module import RewardForward
from .run_log import RunLog
from .schedule import set_lr, tie_margin

RESUME_KEYS = ("lora_rank", "lora_alpha", "lora_targets", "lora_vision", "batch_pairs", "grad_accum", "seed", "epochs", "optimizer")
"""Settings a resumed run must share with the checkpoint (the world size is not one of them)."""


class Trainer:
    """Fine-tunes one base bundle on preference pairs; every rank of a launch builds one."""

    def __init__(self, base: str | Path, output: str | Path, config: TrainConfig = TrainConfig(), *, device: str | None = None,
                 log_stream: TextIO | None = None, ranks: Ranks | None = None, store: str | Path | None = None):
        self.cfg = config
        self.output = Path(output)
        self.log_stream = log_stream or sys.stderr
        self.ranks = ranks or Ranks.start(device)
        if self.ranks.is_main:
            self.output.mkdir(parents=True, exist_ok=True)
        self.device = self.ranks.device
        dtype_name = config.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        torch.manual_seed(config.seed)
        workers = max(1, (os.cpu_count() or 1) // max(1, self.ranks.local_world))
        self.rm = RewardModel.from_pretrained(base, device=self.device, dtype=DTYPES[dtype_name], verify=True, workers=workers)
        self.base = self.rm.path
        self.head = trainable_head(self.rm, self.device)
        self.adapted = add_lora(self.rm, config)
        self.lora_params = [p for p in self.rm.backbone.parameters() if p.requires_grad]
        if not self.lora_params:
            raise InputError(f"lora_targets={list(config.lora_targets)}", "matched no layer of the language model")
        ckpt = config.gradient_checkpointing if config.gradient_checkpointing is not None else self.device.type == "cuda"
        self.ranks.agree(run_facts(config, self.rm))  # before DDP compares shapes: one line naming both ranks, not a crash
        self.module = self.ranks.accelerator.prepare(RewardForward(self.rm.runtime, self.head, checkpointing=ckpt))
        self.optimizer = make_optimizer(config, self.lora_params, self.head)
        self.progress = Progress()
        self.tau = 0.0
        self.store = store
        self.feed = self._feed()
        self.sources: dict[str, str] = {}  # digest of the pairs load_pairs returned -> where they came from

    # ------------------------------------------------------------ set-up

    def _feed(self) -> Feed | None:
        """Where videos come from; None for a store not built yet (``build_store`` makes it)."""
        if self.store is not None:
            from .store import StoreReader

            if not (Path(self.store) / "store.json").is_file():
                return None
            return Feed(self.rm, "store", StoreReader(self.store, self.rm.fingerprint, self.rm.contract.fingerprint), say=self.say)
        return Feed(self.rm, "memory" if self.cfg.cache_inputs else "files", say=self.say)

    def say(self, line: str) -> None:
        prefix = f"[rank {self.ranks.rank}] " if self.ranks.world > 1 and not self.ranks.is_main else ""
        if self.ranks.is_main or "skipped" in line:
            print(prefix + line, file=self.log_stream, flush=True)

    # ------------------------------------------------------------ data

    def load_pairs(self, path: str | Path, what: str) -> list[Pair]:
        """Usable pairs; a bad pair is reported and skipped, never fatal (see ``Feed.ready`` for when)."""
        if self.feed is None:
            raise InputError(str(self.store), "is no prepared-input store yet; build it with nvrm prefs prepare (nvrm train --store builds it too)")
        rows = read_pairs(path)
        good = [r for r in rows if isinstance(r, Pair)]
        for r in rows:
            if isinstance(r, PairProblem) and self.ranks.is_main:
                self.say(f"nvrm train: skipped {what} {r.message}")
        out = self.feed.ready(good, what)
        if not out:
            raise InputError(str(path), f"no usable {what} pairs")
        self.sources[pairs_digest(out)] = f"{len(out)} pairs from {path}"
        self.say(f"nvrm train: {len(out)} {what} pairs ready ({len(rows) - len(out)} skipped)")
        return out

    def build_store(self, pairs_files: Sequence[str | Path]) -> dict[str, Any]:
        """Put every video the pairs files name into ``store`` (each rank a share of them), then read from it."""
        from .store import build_store

        videos = sorted({k for f in pairs_files for r in read_pairs(f) if isinstance(r, Pair) for k in pair_videos(r)})
        share = videos[self.ranks.rank :: self.ranks.world]
        counts = build_store(self.rm, share, self.store, on_error=lambda p, role, e: self.say(f"nvrm train: skipped {role} {p}: {e}"),
                             say=self.say if self.ranks.is_main else None)
        totals = dict(zip(counts, self.ranks.sum(list(counts.values()))))
        self.ranks.barrier()
        self.feed = self._feed()
        return {k: int(v) for k, v in totals.items()}

    # ------------------------------------------------------------ checkpoints

    def save(self) -> None:
        """A checkpoint of this step (rank 0 writes it; every rank waits until it is on disk)."""
        if self.ranks.is_main:
            checkpoint.save(self, self.output / "checkpoints")
        self.ranks.barrier()

    def resume(self) -> bool:
        """Restore the latest checkpoint under the output folder on every rank; False if there is none."""
        found = checkpoint.restore(self, self.output / "checkpoints", RESUME_KEYS)
        if found and self.ranks.is_main:
            checkpoint.trim_metrics(self.output / "metrics.jsonl", self.progress.step)
        self.ranks.barrier()
        return found

    # ------------------------------------------------------------ evaluation

    def evaluate(self, pairs: Sequence[Pair]) -> dict[str, Any]:
        """Held-out metrics, per pair: each rank scores its share (no padding), rank 0 summarises all of them."""
        module = self.ranks.accelerator.unwrap_model(self.module)  # not DDP's forward: the shards may differ in size
        return evaluate_on_ranks(module, self.feed, self.ranks, pairs, self.cfg.batch_pairs)

    # ------------------------------------------------------------ training

    def train(self, train_pairs: Sequence[Pair], eval_pairs: Sequence[Pair] | None = None) -> dict[str, Any]:
        """Train to the end (or ``stop_after_steps``); returns steps, seconds, world size and whether it stopped early."""
        cfg, r = self.cfg, self.ranks
        r.agree(data_facts(train_pairs, eval_pairs, self.progress, self.sources))  # before the first step
        self.tau = tie_margin(cfg, train_pairs)
        plan = StepPlan(len(train_pairs), cfg.batch_pairs, cfg.grad_accum, cfg.seed)
        self.total_steps = plan.steps_per_epoch * cfg.epochs
        n_params = sum(p.numel() for p in self.lora_params) + sum(p.numel() for p in self.head.parameters())
        self.say(f"nvrm train: {len(train_pairs)} pairs, {cfg.epochs} epoch(s) x {plan.steps_per_epoch} step(s) on {r.world} process(es), "
                 f"{n_params} trainable parameters, tie margin {self.tau:.3f}")
        loop = Loop(ranks=r, module=self.module, params=self.lora_params + list(self.head.parameters()), optimizer=self.optimizer, feed=self.feed,
                    plan=plan, pairs=train_pairs, tau=self.tau, max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, say=self.say)
        log = RunLog(self.output / "metrics.jsonl" if r.is_main else None, self.say, self.total_steps)
        t0, stopped = time.perf_counter(), False
        try:
            while self.progress.epoch < cfg.epochs and not stopped:
                stopped = self._epoch(loop, plan, eval_pairs, log, t0)
        finally:
            log.close()
        return {"steps": self.progress.step, "seconds": time.perf_counter() - t0, "world_size": r.world, "stopped_early": stopped}

    def _epoch(self, loop: Loop, plan: StepPlan, eval_pairs: Sequence[Pair] | None, log: RunLog, t0: float) -> bool:
        """The rest of the current epoch; True when ``stop_after_steps`` stopped it."""
        cfg, pr = self.cfg, self.progress
        tasks = loop.submit(pr.epoch, pr.micro) if pr.micro < plan.micro_per_epoch else None
        while pr.micro < plan.micro_per_epoch:
            self.module.train()
            lr = set_lr(self.optimizer, cfg, pr.step, self.total_steps)
            ahead = pr.micro + cfg.grad_accum
            upcoming = loop.submit(pr.epoch, ahead) if ahead < plan.micro_per_epoch else None  # prepared meanwhile
            stats = loop.run_step(pr, tasks)
            pr.micro, tasks = ahead, upcoming
            if stats is None:  # no pair of this step was usable on any rank (each was reported)
                continue
            pr.step += 1
            log.step(stats.row(pr, lr, time.perf_counter() - t0))
            if eval_pairs and cfg.eval_every and pr.step % cfg.eval_every == 0:
                self._evaluate_and_log(eval_pairs, log)
            if cfg.stop_after_steps and pr.step >= cfg.stop_after_steps:
                self.save()
                return True
            if pr.step % cfg.save_every == 0 and pr.micro < plan.micro_per_epoch:
                self.save()
        if pr.step == 0:  # every pair of a whole epoch was skipped, on every rank (each was reported)
            raise TrainingError(f"no training pair was usable: all {plan.n_pairs} were skipped (the reasons are above); "
                                "nothing is trained or exported")
        pr.epoch, pr.micro = pr.epoch + 1, 0
        if eval_pairs and not cfg.eval_every:
            self._evaluate_and_log(eval_pairs, log)
        self.save()
        return False

    def _evaluate_and_log(self, eval_pairs: Sequence[Pair], log: RunLog) -> None:
        ev = self.evaluate(eval_pairs)
        self.progress.history.append({"step": self.progress.step, "accuracy": ev["accuracy"], "mean_margin": ev["mean_margin"]})
        log.evaluation(self.progress.step, ev)

    # ------------------------------------------------------------ export

    def weights_digest(self) -> str:
        """sha256 of this rank's trainable weights (every rank's must agree)."""
        return _digest(self.lora_params + list(self.head.parameters()))

    def export(self, out: str | Path, train_file: str | Path, eval_file: str | Path | None, summary: dict[str, Any]):
        """Rank 0 merges LoRA and writes the bundle (``nvrm.train.export``); (path, merged model) there, (None, None) elsewhere."""
        from .export import export_trained

        result = export_trained(self, Path(out), train_file, eval_file, summary) if self.ranks.is_main else (None, None)
        self.ranks.barrier()
        return result


def _digest(params: Sequence[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def run_facts(config: TrainConfig, rm: RewardModel) -> dict[str, list[str]]:
    """What every rank of a run must share before the model is wrapped: each setting and the base bundle
    (name -> [what is compared, what is shown]; see ``Ranks.agree``)."""
    facts = {name: [json.dumps(value, sort_keys=True), json.dumps(value)] for name, value in config.to_dict().items()}
    shown = f"revision {rm.revision} (preprocessing {rm.fingerprint[:12]}) at {rm.path}"
    facts["the base bundle"] = [f"{rm.revision}:{rm.fingerprint}", shown]
    return facts


def data_facts(train_pairs: Sequence[Pair], eval_pairs: Sequence[Pair] | None, progress: Progress,
               sources: dict[str, str]) -> dict[str, list[str]]:
    """What every rank must share before the first step: the pairs (a digest of every field of every pair, shown
    with the file they came from) and where a resumed run starts."""
    facts = {}
    for what, pairs in (("the training pairs", train_pairs), ("the eval pairs", eval_pairs or [])):
        digest = pairs_digest(pairs)
        facts[what] = [digest, f"{sources.get(digest, f'{len(pairs)} pairs')} (sha256 {digest[:12]})"]
    at = f"step {progress.step}, epoch {progress.epoch + 1}, micro-batch {progress.micro}"
    facts["the position it resumes from"] = [at, at]
    return facts
