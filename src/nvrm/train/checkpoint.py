"""Checkpoints in safetensors + JSON only (no pickle): LoRA weights, head, optimizer, counters."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..errors import InputError


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
    tensors["rng.torch"] = torch.get_rng_state()
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
    except (OSError, ValueError, json.JSONDecodeError) as e:
        raise InputError(str(path), f"checkpoint is unreadable ({' '.join(str(e).split())})") from e
