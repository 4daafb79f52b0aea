"""Checkpoints in safetensors + JSON only (no pickle): LoRA weights, head, optimizer, counters."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..errors import InputError, TrainingError


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state dict into tensors and JSON-able metadata."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            key = f"{idx}.{name}"
            if torch.is_tensor(value):
                tensors[key] = value.detach().cpu().contiguous()
            else:
                scalars[key] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    root: Path,
    step: int,
    *,
    adapter: dict[str, torch.Tensor],
    head: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    counters: dict[str, Any],
    keep: int,
) -> Path:
    """Write ``root/step-NNNNNN`` atomically (temp dir + rename) and prune old ones."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.detach().cpu().contiguous() for k, v in adapter.items()}, str(tmp / "adapter.safetensors"))
    save_file({k: v.detach().cpu().contiguous() for k, v in head.items()}, str(tmp / "head.safetensors"))
    tensors, meta = optimizer_tensors(optimizer)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"step": step, **counters, "optimizer": meta}, indent=1))
    for f in tmp.iterdir():
        with f.open("rb") as h:
            os.fsync(h.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    found = sorted(p for p in root.glob("step-*") if (p / "state.json").is_file())
    return found[-1] if found else None


def read_checkpoint(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / "state.json").read_text())
        opt = load_file(str(path / "optimizer.safetensors"))
        return {
            "state": state,
            "adapter": load_file(str(path / "adapter.safetensors")),
            "head": load_file(str(path / "head.safetensors")),
            "optimizer": opt,
        }
    except Exception as e:  # noqa: BLE001 - OSError, bad JSON, a truncated safetensors file (SafetensorError): all unreadable
        raise InputError(
            str(path), f"checkpoint is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]}); delete it to resume from the one before"
        ) from e


def save(trainer, root: Path) -> Path:
    """``trainer``'s state at its current step (rank 0 calls this; the weights are the same on every rank)."""
    from peft import get_peft_model_state_dict

    adapter = {f"{name}/{k}": v for name in trainer.adapted for k, v in get_peft_model_state_dict(getattr(trainer.rm.backbone, name)).items()}
    head = {"weight": trainer.head.weight, **({"bias": trainer.head.bias} if trainer.head.bias is not None else {})}
    if not all(bool(torch.isfinite(t).all()) for t in [*adapter.values(), *head.values()]):
        raise TrainingError(f"step {trainer.progress.step}: the weights are not finite; no checkpoint is written (the last one kept is the last finite model)")
    pr = trainer.progress
    counters = {"epoch": pr.epoch, "micro": pr.micro, "config": trainer.cfg.to_dict(), "history": pr.history, "world_size": trainer.ranks.world}
    return save_checkpoint(root, pr.step, adapter=adapter, head=head, optimizer=trainer.optimizer, counters=counters, keep=trainer.cfg.keep_checkpoints)


def restore(trainer, root: Path, keys: tuple[str, ...]) -> bool:
    """The latest checkpoint under ``root`` into ``trainer`` (on every rank); False if there is none.

    Counters are global (optimizer steps, micro-batches of the epoch), so a run saved at one world size
    resumes at another; the settings in ``keys`` must be the checkpoint's."""
    from peft import set_peft_model_state_dict

    path = latest_checkpoint(root)
    if path is None:
        return False
    ck = read_checkpoint(path)
    saved, now = ck["state"]["config"], trainer.cfg.to_dict()
    for key in keys:
        if saved.get(key, "adamw" if key == "optimizer" else None) != now.get(key):
            raise InputError(str(path), f"was trained with {key}={saved.get(key)!r}, not {now.get(key)!r}; resume with the same settings")
    for name in trainer.adapted:
        part = {k.split("/", 1)[1]: v.to(trainer.device) for k, v in ck["adapter"].items() if k.startswith(name + "/")}
        set_peft_model_state_dict(getattr(trainer.rm.backbone, name), part)
    with torch.no_grad():
        trainer.head.weight.copy_(ck["head"]["weight"])
        if trainer.head.bias is not None:
            trainer.head.bias.copy_(ck["head"]["bias"])
    opt = {k: v for k, v in ck["optimizer"].items() if not k.startswith("rng.")}
    load_optimizer(trainer.optimizer, opt, ck["state"]["optimizer"])
    st, pr = ck["state"], trainer.progress
    pr.step, pr.epoch, pr.micro, pr.history = st["step"], st["epoch"], st["micro"], st.get("history", [])
    was = st.get("world_size", 1)
    at = f" (saved by {was} process(es), resumed on {trainer.ranks.world})" if was != trainer.ranks.world else ""
    trainer.say(f"nvrm train: resumed from {path} (step {pr.step}, epoch {pr.epoch + 1}, micro-batch {pr.micro}){at}")
    return True


def trim_metrics(path: Path, step: int) -> None:
    """Drop metrics lines of steps after ``step`` (a run killed after its last checkpoint logged them): so a
    resumed run logs each step exactly once."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue  # a torn last line
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(k + "\n" for k in keep))
    os.replace(tmp, path)
