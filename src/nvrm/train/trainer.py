"""Bradley-Terry training of the reward model with LoRA on the language model.

One code path with scoring: pairs go through ``RewardModel.prepare`` (the
contract) and rewards through ``forward_rewards`` (backbone + head, last
token). The vision tower and the base language-model weights stay frozen;
LoRA adapters (peft) on the language model and the whole head are trained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TextIO

import numpy as np
import torch

from ..errors import InputError, NvrmError
from ..forward.model import DTYPES, RewardHead
from ..pairs import Pair, PairProblem, read_pairs
from ..report.evaluate import PairOutcome, summarize
from ..scoring import RewardModel, default_device
from .checkpoint import latest_checkpoint, load_optimizer, read_checkpoint, save_checkpoint
from .config import VISION_LORA_TARGETS, TrainConfig
from .export import base_dtype, export_bundle
from .loss import pair_loss

log = logging.getLogger(__name__)


@dataclass
class EncodedPair:
    pair: Pair
    chosen: Any
    rejected: Any


def _file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class Trainer:
    def __init__(
        self,
        base: str | Path,
        output: str | Path,
        config: TrainConfig = TrainConfig(),
        *,
        device: str | torch.device | None = None,
        log_stream: TextIO | None = None,
    ):
        self.cfg = config
        self.output = Path(output)
        self.output.mkdir(parents=True, exist_ok=True)
        self.log_stream = log_stream or sys.stderr
        self.device = torch.device(device) if device is not None else default_device()
        dtype_name = config.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        torch.manual_seed(config.seed)
        self.rm = RewardModel.from_pretrained(base, device=self.device, dtype=DTYPES[dtype_name], verify=True)
        self.base = self.rm.path
        self.export_dtype = base_dtype(self.base)
        hidden = self.rm.head.weight.shape[-1]
        bias = self.rm.head.bias
        self.head = RewardHead(self.rm.head.weight.detach().float().reshape(1, hidden), None if bias is None else bias.detach().float(), torch.float32)
        self.head.to(self.device)
        self.head.requires_grad_(True)

        from peft import LoraConfig, get_peft_model

        def lora(targets) -> LoraConfig:
            return LoraConfig(
                r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout, target_modules=list(targets), bias="none"
            )

        self.adapted = ["language_model"] + (["visual"] if config.lora_vision else [])
        targets = {"language_model": config.lora_targets, "visual": VISION_LORA_TARGETS}
        for name in self.adapted:
            setattr(self.rm.backbone, name, get_peft_model(getattr(self.rm.backbone, name), lora(targets[name])))
        self.lora_params = [p for p in self.rm.backbone.parameters() if p.requires_grad]
        if not self.lora_params:
            raise InputError(f"lora_targets={list(config.lora_targets)}", "matched no layer of the language model")
        head_lr = config.head_lr if config.head_lr is not None else config.lr
        self.optimizer = torch.optim.AdamW(
            [
                {"params": self.lora_params, "lr": config.lr, "weight_decay": config.weight_decay},
                {"params": list(self.head.parameters()), "lr": head_lr, "weight_decay": 0.0},
            ]
        )
        self.step = 0
        self.epoch = 0
        self.micro = 0  # micro-batches consumed in the current epoch
        self.total_steps = 0
        self.tau = 0.0
        self.history: list[dict] = []
        self._cache: dict[tuple[str, str], Any] = {}

    # ------------------------------------------------------------ data

    def _say(self, line: str) -> None:
        print(line, file=self.log_stream, flush=True)

    def _cached_videos(self, keys: Sequence[tuple[str, str]]) -> None:
        """Prepare (in the engine's workers) every (path, role) not in the cache yet."""
        todo = [k for k in dict.fromkeys(keys) if k not in self._cache]
        jobs = [self.rm.engine.submit_video(source, role) for source, role in todo]
        for key, job in zip(todo, jobs):
            try:
                # training needs the patches, grids and times, not the images: half the memory
                self._cache[key] = dataclasses.replace(job.result(), images=())
            except NvrmError as e:
                self._cache[key] = e

    def _input(self, source: str, role: str):
        """What an item job gets for a video: the cached prepared video, or the path itself."""
        if not self.cfg.cache_inputs:
            return source
        hit = self._cache[(source, role)]
        if isinstance(hit, NvrmError):
            raise hit
        return hit

    @staticmethod
    def _keys(p: Pair) -> list[tuple[str, str]]:
        keys = [(p.context, "context"), (p.chosen, "candidate"), (p.rejected, "candidate")]
        return keys + [(p.rejected_context, "context")] if p.rejected_context else keys

    def load_pairs(self, path: str | Path, what: str) -> list[Pair]:
        """Usable pairs; a bad pair is reported and skipped, never fatal.

        With ``cache_inputs`` every video is decoded and prepared now (so bad
        ones are found before training starts) and kept, encoded, for every
        epoch; otherwise pairs are prepared per batch and a bad one is skipped
        when it is reached.
        """
        rows = read_pairs(path)
        good = [r for r in rows if isinstance(r, Pair)]
        for r in rows:
            if isinstance(r, PairProblem):
                self._say(f"nvrm train: skipped {what} {r.message}")
        out = good
        if self.cfg.cache_inputs:
            self._cached_videos([k for p in good for k in self._keys(p)])
            out = []
            for p in good:
                bad = next((self._cache[k] for k in self._keys(p) if isinstance(self._cache[k], NvrmError)), None)
                if bad is None:
                    out.append(p)
                else:
                    self._say(f"nvrm train: skipped {what} pairs line {p.line}: {bad}")
        if not out:
            raise InputError(str(path), f"no usable {what} pairs")
        self._say(f"nvrm train: {len(out)} {what} pairs ready ({len(rows) - len(out)} skipped)")
        return out

    def _submit(self, pairs: Sequence[Pair]) -> list[tuple[Pair, Any, Any]]:
        """Item jobs (text, positions; the videos too unless cached) for both sides of each pair."""
        jobs = []
        engine = self.rm.engine
        for p in pairs:
            try:
                (cp, cc, cv), (rp, rc, rv) = p.sides
                chosen = (cp, self._input(cc, "context"), self._input(cv, "candidate"))
                rejected = (rp, self._input(rc, "context"), self._input(rv, "candidate"))
            except NvrmError as e:
                jobs.append((p, e, None))
                continue
            jobs.append((p, engine.submit_item(*chosen), engine.submit_item(*rejected)))
        return jobs

    def _collect(self, jobs) -> list[EncodedPair]:
        out = []
        for p, chosen, rejected in jobs:
            try:
                if isinstance(chosen, NvrmError):
                    raise chosen
                out.append(EncodedPair(p, chosen.result().encoded, rejected.result().encoded))
            except NvrmError as e:
                self._say(f"nvrm train: skipped pairs line {p.line}: {e}")
        return out

    # ------------------------------------------------------------ model pieces

    def rewards(self, encoded: Sequence[Any]) -> torch.Tensor:
        """Rewards [B] (float32, with gradients) of encoded items, through the scoring forward."""
        return self.rm.rewards(encoded, head=self.head).float()

    def _lr_factor(self, step: int) -> float:
        warm = self.cfg.warmup_steps
        if warm and step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, self.total_steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def _set_lr(self) -> float:
        f = self._lr_factor(self.step)
        base = [self.cfg.lr, self.cfg.head_lr if self.cfg.head_lr is not None else self.cfg.lr]
        for group, lr in zip(self.optimizer.param_groups, base):
            group["lr"] = lr * f
        return self.optimizer.param_groups[0]["lr"]

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        out = {}
        for name in self.adapted:
            for k, v in get_peft_model_state_dict(getattr(self.rm.backbone, name)).items():
                out[f"{name}/{k}"] = v
        return out

    def _head_state(self) -> dict[str, torch.Tensor]:
        d = {"weight": self.head.weight}
        if self.head.bias is not None:
            d["bias"] = self.head.bias
        return d

    # ------------------------------------------------------------ checkpoints

    def _counters(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "micro": self.micro, "config": self.cfg.to_dict(), "history": self.history}

    def save(self) -> Path:
        return save_checkpoint(
            self.output / "checkpoints",
            self.step,
            adapter=self._adapter_state(),
            head=self._head_state(),
            optimizer=self.optimizer,
            counters=self._counters(),
            keep=self.cfg.keep_checkpoints,
        )

    def resume(self) -> bool:
        """Restore the latest checkpoint under the output folder; False if there is none."""
        from peft import set_peft_model_state_dict

        path = latest_checkpoint(self.output / "checkpoints")
        if path is None:
            return False
        ck = read_checkpoint(path)
        saved = ck["state"]["config"]
        for key in ("lora_rank", "lora_alpha", "lora_targets", "lora_vision", "batch_pairs", "grad_accum", "seed", "epochs"):
            if saved.get(key) != self.cfg.to_dict().get(key):
                raise InputError(str(path), f"was trained with {key}={saved.get(key)!r}, not {self.cfg.to_dict().get(key)!r}; resume with the same settings")
        for name in self.adapted:
            part = {k.split("/", 1)[1]: v.to(self.device) for k, v in ck["adapter"].items() if k.startswith(name + "/")}
            set_peft_model_state_dict(getattr(self.rm.backbone, name), part)
        with torch.no_grad():
            self.head.weight.copy_(ck["head"]["weight"])
            if self.head.bias is not None:
                self.head.bias.copy_(ck["head"]["bias"])
        opt = dict(ck["optimizer"])
        rng = opt.pop("rng.torch", None)
        load_optimizer(self.optimizer, opt, ck["state"]["optimizer"])
        if rng is not None:
            torch.set_rng_state(rng)
        self.step = ck["state"]["step"]
        self.epoch = ck["state"]["epoch"]
        self.micro = ck["state"]["micro"]
        self.history = ck["state"].get("history", [])
        self._say(f"nvrm train: resumed from {path} (step {self.step}, epoch {self.epoch + 1}, micro-batch {self.micro})")
        return True

    # ------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, pairs: Sequence[Pair]) -> dict[str, Any]:
        self.rm.backbone.eval()
        outcomes = []
        starts = list(range(0, len(pairs), self.cfg.batch_pairs))
        ahead = self._submit(pairs[: self.cfg.batch_pairs])
        for k, i in enumerate(starts):
            chunk = self._collect(ahead)
            if k + 1 < len(starts):
                ahead = self._submit(pairs[starts[k + 1] : starts[k + 1] + self.cfg.batch_pairs])
            if not chunk:
                continue
            r = self.rewards([p.chosen for p in chunk] + [p.rejected for p in chunk])
            n = len(chunk)
            outcomes += [PairOutcome(float(r[k]), float(r[n + k]), p.pair.tie) for k, p in enumerate(chunk)]
        return summarize(outcomes)

    # ------------------------------------------------------------ training

    def train(self, train_pairs: Sequence[Pair], eval_pairs: Sequence[Pair] | None = None) -> dict[str, Any]:
        cfg = self.cfg
        has_ties = any(p.tie for p in train_pairs)
        self.tau = cfg.tie_margin if cfg.tie_margin is not None else (math.log(2.0) if has_ties else 0.0)
        if has_ties and self.tau <= 0:
            raise InputError(f"tie_margin={cfg.tie_margin}", "the training pairs contain ties; a tie margin > 0 is needed")
        n = len(train_pairs)
        micro_per_epoch = math.ceil(n / cfg.batch_pairs)
        steps_per_epoch = math.ceil(micro_per_epoch / cfg.grad_accum)
        self.total_steps = steps_per_epoch * cfg.epochs
        self._say(
            f"nvrm train: {n} pairs, {cfg.epochs} epoch(s) x {steps_per_epoch} step(s), "
            f"{sum(p.numel() for p in self.lora_params)} LoRA + {sum(p.numel() for p in self.head.parameters())} head parameters, "
            f"tie margin {self.tau:.3f}"
        )
        metrics_file = (self.output / "metrics.jsonl").open("a")
        t0 = time.perf_counter()
        try:
            while self.epoch < cfg.epochs:
                order = np.random.default_rng(cfg.seed + 1_000 * self.epoch).permutation(n)
                micro_batches = [order[i : i + cfg.batch_pairs] for i in range(0, n, cfg.batch_pairs)]
                ahead: dict[int, list] = {}
                while self.micro < len(micro_batches):
                    self.rm.backbone.train()
                    lr = self._set_lr()
                    group = micro_batches[self.micro : self.micro + cfg.grad_accum]
                    self.optimizer.zero_grad(set_to_none=True)
                    losses, ds, ties = [], [], []
                    here = range(self.micro, min(self.micro + cfg.grad_accum, len(micro_batches)))
                    jobs = [ahead.pop(m, None) or self._submit([train_pairs[i] for i in micro_batches[m]]) for m in here]
                    for m in range(here.stop, min(here.stop + cfg.grad_accum, len(micro_batches))):
                        ahead[m] = self._submit([train_pairs[i] for i in micro_batches[m]])  # prepared meanwhile
                    for futures in jobs:
                        chunk = self._collect(futures)
                        if not chunk:
                            continue
                        r = self.rewards([p.chosen for p in chunk] + [p.rejected for p in chunk])
                        d = r[: len(chunk)] - r[len(chunk) :]
                        tie = torch.tensor([p.pair.tie for p in chunk], device=d.device)
                        loss = pair_loss(d, tie, self.tau)
                        (loss * len(chunk) / sum(len(g) for g in group)).backward()
                        losses.append(float(loss.detach()) * len(chunk))
                        ds += d.detach().float().cpu().tolist()
                        ties += [p.pair.tie for p in chunk]
                    if not ds:  # every pair of this step failed to prepare (reported above)
                        self.micro += len(group)
                        continue
                    params = self.lora_params + list(self.head.parameters())
                    if cfg.max_grad_norm:
                        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                    self.optimizer.step()
                    self.micro += len(group)
                    self.step += 1
                    pref = [d for d, t in zip(ds, ties) if not t]
                    row = {
                        "step": self.step,
                        "epoch": self.epoch + 1,
                        "loss": sum(losses) / len(ds),
                        "accuracy": (sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in pref) / len(pref)) if pref else None,
                        "margin": (sum(pref) / len(pref)) if pref else None,
                        "lr": lr,
                        "seconds": time.perf_counter() - t0,
                    }
                    metrics_file.write(json.dumps(row) + "\n")
                    metrics_file.flush()
                    acc = "n/a" if row["accuracy"] is None else f"{row['accuracy']:.2f}"
                    margin = "n/a" if row["margin"] is None else f"{row['margin']:+.3f}"
                    self._say(
                        f"step {self.step}/{self.total_steps} epoch {self.epoch + 1} loss {row['loss']:.4f} "
                        f"acc {acc} margin {margin} lr {lr:.2e} ({row['seconds']:.0f} s)"
                    )
                    if eval_pairs and cfg.eval_every and self.step % cfg.eval_every == 0:
                        self._evaluate_and_log(eval_pairs, metrics_file)
                    if self.step % cfg.save_every == 0 and self.micro < len(micro_batches):
                        self.save()
                self.epoch += 1
                self.micro = 0
                if eval_pairs and not cfg.eval_every:
                    self._evaluate_and_log(eval_pairs, metrics_file)
                self.save()
        finally:
            metrics_file.close()
        return {"steps": self.step, "seconds": time.perf_counter() - t0}

    def _evaluate_and_log(self, eval_pairs: Sequence[Pair], metrics_file) -> None:
        ev = self.evaluate(eval_pairs)
        self.history.append({"step": self.step, "accuracy": ev["accuracy"], "mean_margin": ev["mean_margin"]})
        metrics_file.write(json.dumps({"step": self.step, "eval": ev}) + "\n")
        metrics_file.flush()
        acc = "n/a" if ev["accuracy"] is None else f"{ev['accuracy']:.4f}"
        margin = "n/a" if ev["mean_margin"] is None else f"{ev['mean_margin']:+.4f}"
        self._say(f"eval step {self.step}: accuracy {acc} over {ev['n']} pairs, mean margin {margin}")

    # ------------------------------------------------------------ export

    def merged_model(self) -> RewardModel:
        """Merge LoRA into the backbone and return the runtime model with exactly the
        weights the export stores (parameters in the export dtype; buffers such as
        the rotary frequencies stay as the runtime creates them)."""
        for name in self.adapted:
            module = getattr(self.rm.backbone, name)
            if hasattr(module, "merge_and_unload"):
                setattr(self.rm.backbone, name, module.merge_and_unload())
        backbone = self.rm.backbone.eval()
        backbone.requires_grad_(False)
        for param in backbone.parameters():
            param.data = param.data.to(self.export_dtype)
        weight = self.head.weight.detach().to(self.export_dtype).reshape(1, -1)
        bias = self.head.bias.detach().to(self.export_dtype).reshape(1) if self.head.bias is not None else None
        head = RewardHead(weight, bias, DTYPES[self.rm.contract.head_dtype]).to(self.device)
        return RewardModel(
            backbone, head, self.rm.processor, self.rm.contract, device=self.device, settings=self.rm.settings, engine=self.rm.engine
        )

    def export(self, out: str | Path, train_file: str | Path, eval_file: str | Path | None, summary: dict[str, Any]) -> tuple[Path, RewardModel]:
        model = self.merged_model()
        state = {k: v for k, v in model.backbone.state_dict().items()}
        digest = hashlib.sha256()
        for k in sorted(state):
            digest.update(k.encode())
            digest.update(state[k].float().cpu().numpy().tobytes())
        digest.update(model.head.weight.float().cpu().numpy().tobytes())
        revision = f"nvrm-train-{digest.hexdigest()[:12]}"
        model.revision = revision
        training = {
            "base": {"path": str(self.base), "revision": self.rm.revision},
            "config": self.cfg.to_dict(),
            "tie_margin": self.tau,
            "data": {
                "train": {"path": str(train_file), "sha256": _file_digest(Path(train_file))},
                "eval": {"path": str(eval_file), "sha256": _file_digest(Path(eval_file))} if eval_file else None,
            },
            "contract": self.rm.fingerprint,
            "summary": summary,
        }
        path = export_bundle(
            Path(out),
            base=self.base,
            backbone_state=state,
            head_weight=self.head.weight,
            head_bias=self.head.bias,
            dtype=self.export_dtype,
            revision=revision,
            training=training,
        )
        return path, model
