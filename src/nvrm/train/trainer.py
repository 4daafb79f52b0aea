"""Bradley-Terry training of the reward model with LoRA, on one process or many (Accelerate).

One code path with scoring: pairs go through the model's engine (the contract) and rewards through
``RewardForward`` (the scoring forward, wrapped whole by DDP). The vision tower and the base
language-model weights stay frozen; LoRA adapters (peft) on the language model and the whole head
are trained. The parts:

- ``dist.Ranks``: the processes of the run and their collectives;
- ``data``: the global plan (which pairs, which rank) and the feed (files, memory or a store);
- ``loop.Loop``: one optimizer step on every rank;
- ``checkpoint``: safetensors checkpoints in global units (resume at any world size);
- ``export``: the merged model as a release-layout bundle.

Only rank 0 writes files (metrics, checkpoints, the export, the summary); the others wait for it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

import torch

from ..errors import InputError, TrainingError
from ..forward.model import DTYPES, RewardHead
from ..prefs.pairs import Pair, PairProblem, read_pairs
from ..report.evaluate import PairOutcome, summarize
from ..scoring.reward_model import RewardModel
from . import checkpoint
from .config import VISION_LORA_TARGETS, TrainConfig
from .data import Feed, StepPlan, pair_videos, pairs_digest
from .dist import Ranks
from .loop import Loop, Progress
from .reward_module import RewardForward

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
        self.head = self._trainable_head()
        self.adapted = self._add_lora()
        self.lora_params = [p for p in self.rm.backbone.parameters() if p.requires_grad]
        if not self.lora_params:
            raise InputError(f"lora_targets={list(config.lora_targets)}", "matched no layer of the language model")
        ckpt = config.gradient_checkpointing if config.gradient_checkpointing is not None else self.device.type == "cuda"
        self.ranks.agree(run_facts(config, self.rm))  # before DDP compares shapes: one line naming both ranks, not a crash
        self.module = self.ranks.accelerator.prepare(RewardForward(self.rm.runtime, self.head, checkpointing=ckpt))
        self.optimizer = self._optimizer()
        self.progress = Progress()
        self.tau = 0.0
        self.store = store
        self.feed = self._feed()
        self.sources: dict[str, str] = {}  # digest of the pairs load_pairs returned -> where they came from

    # ------------------------------------------------------------ set-up

    def _trainable_head(self) -> RewardHead:
        w, b = self.rm.head.weight, self.rm.head.bias
        head = RewardHead(w.detach().float().reshape(1, w.shape[-1]), None if b is None else b.detach().float(), torch.float32).to(self.device)
        head.requires_grad_(True)
        return head

    def _add_lora(self) -> list[str]:
        from peft import LoraConfig, get_peft_model

        cfg = self.cfg
        adapted = ["language_model"] + (["visual"] if cfg.lora_vision else [])
        targets = {"language_model": cfg.lora_targets, "visual": VISION_LORA_TARGETS}
        for name in adapted:
            lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=list(targets[name]), bias="none")
            setattr(self.rm.backbone, name, get_peft_model(getattr(self.rm.backbone, name), lora))
        return adapted

    def _optimizer(self) -> torch.optim.Optimizer:
        cfg = self.cfg
        head_lr = cfg.head_lr if cfg.head_lr is not None else cfg.lr
        groups = [{"params": self.lora_params, "lr": cfg.lr, "weight_decay": cfg.weight_decay},
                  {"params": list(self.head.parameters()), "lr": head_lr, "weight_decay": 0.0}]
        return torch.optim.SGD(groups) if cfg.optimizer == "sgd" else torch.optim.AdamW(groups)

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

    @torch.no_grad()
    def evaluate(self, pairs: Sequence[Pair]) -> dict[str, Any]:
        """Held-out metrics, per pair: each rank scores its share (no padding), rank 0 summarises all of them."""
        module = self.ranks.accelerator.unwrap_model(self.module)  # not DDP's forward: the shards may differ in size
        module.eval()
        r, n = self.ranks, self.cfg.batch_pairs
        mine = [(i, pairs[i]) for i in range(r.rank, len(pairs), r.world)]
        outcomes: list[tuple[int, PairOutcome]] = []
        ahead = self.feed.submit(mine[:n])
        for start in range(0, len(mine), n):
            chunk = self.feed.collect(ahead)
            if start + n < len(mine):
                ahead = self.feed.submit(mine[start + n : start + 2 * n])
            if chunk:
                rew = module([p.chosen for p in chunk] + [p.rejected for p in chunk])
                outcomes += [(p.index, PairOutcome(float(rew[k]), float(rew[len(chunk) + k]), p.pair.tie)) for k, p in enumerate(chunk)]
        gathered = r.gather(outcomes)
        summary = summarize([o for _, o in sorted(x for part in gathered for x in part)]) if r.is_main else None
        return r.share(summary)

    # ------------------------------------------------------------ training

    def train(self, train_pairs: Sequence[Pair], eval_pairs: Sequence[Pair] | None = None) -> dict[str, Any]:
        """Train to the end (or ``stop_after_steps``); returns steps, seconds, world size and whether it stopped early."""
        cfg, r = self.cfg, self.ranks
        r.agree(data_facts(train_pairs, eval_pairs, self.progress, self.sources))  # before the first step
        self.tau = self._tie_margin(train_pairs)
        plan = StepPlan(len(train_pairs), cfg.batch_pairs, cfg.grad_accum, cfg.seed)
        self.total_steps = plan.steps_per_epoch * cfg.epochs
        n_params = sum(p.numel() for p in self.lora_params) + sum(p.numel() for p in self.head.parameters())
        self.say(f"nvrm train: {len(train_pairs)} pairs, {cfg.epochs} epoch(s) x {plan.steps_per_epoch} step(s) on {r.world} process(es), "
                 f"{n_params} trainable parameters, tie margin {self.tau:.3f}")
        loop = Loop(ranks=r, module=self.module, params=self.lora_params + list(self.head.parameters()), optimizer=self.optimizer, feed=self.feed,
                    plan=plan, pairs=train_pairs, tau=self.tau, max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, say=self.say)
        metrics = (self.output / "metrics.jsonl").open("a") if r.is_main else None
        t0, stopped = time.perf_counter(), False
        try:
            while self.progress.epoch < cfg.epochs and not stopped:
                stopped = self._epoch(loop, plan, eval_pairs, metrics, t0)
        finally:
            if metrics is not None:
                metrics.close()
        return {"steps": self.progress.step, "seconds": time.perf_counter() - t0, "world_size": r.world, "stopped_early": stopped}

    def _epoch(self, loop: Loop, plan: StepPlan, eval_pairs, metrics, t0: float) -> bool:
        """The rest of the current epoch; True when ``stop_after_steps`` stopped it."""
        cfg, pr = self.cfg, self.progress
        jobs = loop.submit(pr.epoch, pr.micro) if pr.micro < plan.micro_per_epoch else None
        while pr.micro < plan.micro_per_epoch:
            self.module.train()
            lr = self._set_lr()
            ahead = pr.micro + cfg.grad_accum
            upcoming = loop.submit(pr.epoch, ahead) if ahead < plan.micro_per_epoch else None  # prepared meanwhile
            stats = loop.run_step(pr, jobs)
            pr.micro, jobs = ahead, upcoming
            if stats is None:  # no pair of this step was usable on any rank (each was reported)
                continue
            pr.step += 1
            row = stats.row(pr, lr, time.perf_counter() - t0)
            self._log_step(row, metrics)
            if eval_pairs and cfg.eval_every and pr.step % cfg.eval_every == 0:
                self._evaluate_and_log(eval_pairs, metrics)
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
            self._evaluate_and_log(eval_pairs, metrics)
        self.save()
        return False

    def _tie_margin(self, pairs: Sequence[Pair]) -> float:
        has_ties = any(p.tie for p in pairs)
        tau = self.cfg.tie_margin if self.cfg.tie_margin is not None else (math.log(2.0) if has_ties else 0.0)
        if has_ties and tau <= 0:
            raise InputError(f"tie_margin={self.cfg.tie_margin}", "the training pairs contain ties; a tie margin > 0 is needed")
        return tau

    def _set_lr(self) -> float:
        cfg, step = self.cfg, self.progress.step
        warm = cfg.warmup_steps
        if warm and step < warm:
            f = (step + 1) / warm
        else:
            progress = (step - warm) / max(1, self.total_steps - warm)
            f = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        for group, lr in zip(self.optimizer.param_groups, [cfg.lr, cfg.head_lr if cfg.head_lr is not None else cfg.lr]):
            group["lr"] = lr * f
        return self.optimizer.param_groups[0]["lr"]

    def _log_step(self, row: dict[str, Any], metrics) -> None:
        if metrics is not None:
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
        acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.2f}"
        margin = "n/a" if row["margin"] is None else f"{row['margin']:+.3f}"
        self.say(f"step {row['step']}/{self.total_steps} epoch {row['epoch']} loss {row['loss']:.4f} acc {acc} margin {margin} "
                 f"lr {row['lr']:.2e} ({row['seconds']:.0f} s)")

    def _evaluate_and_log(self, eval_pairs: Sequence[Pair], metrics) -> None:
        ev = self.evaluate(eval_pairs)
        self.progress.history.append({"step": self.progress.step, "accuracy": ev["accuracy"], "mean_margin": ev["mean_margin"]})
        if metrics is not None:
            metrics.write(json.dumps({"step": self.progress.step, "eval": ev}) + "\n")
            metrics.flush()
        acc = "n/a" if ev["accuracy"] is None else f"{ev['accuracy']:.4f}"
        margin = "n/a" if ev["mean_margin"] is None else f"{ev['mean_margin']:+.4f}"
        self.say(f"eval step {self.progress.step}: accuracy {acc} over {ev['n']} pairs, mean margin {margin}")

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
