"""Write a trained model as a release-layout bundle the runtime loads unchanged."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..bundle import HEAD_FILE, INDEX_FILE, MANIFEST_NAMES, backbone_files, write_backbone, write_manifest

_SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
# never carried over: weights (rewritten), manifests (rewritten), pickle-based files (never)
_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def base_dtype(base: Path) -> torch.dtype:
    """The dtype the base bundle stores its backbone in."""
    from safetensors import safe_open

    with safe_open(str(backbone_files(base)[0]), framework="pt") as f:
        stored = f.get_slice(next(iter(f.keys()))).get_dtype()  # from the header: no tensor is read
    return _SAFETENSORS_DTYPES[stored]


def copy_assets(base: Path, out: Path) -> list[str]:
    """Tokenizer/processor assets, config, contract, LICENSE/NOTICE: everything but weights and manifests."""
    copied = []
    for p in sorted(base.iterdir()):
        if not p.is_file() or p.name in MANIFEST_NAMES or p.name == INDEX_FILE or p.name == "README.md":
            continue
        if p.suffix.lower() in _SKIP_SUFFIXES:
            continue
        shutil.copy2(p, out / p.name)
        copied.append(p.name)
    return copied


def export_bundle(
    out: Path,
    *,
    base: Path,
    backbone_state: dict[str, torch.Tensor],
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None,
    dtype: torch.dtype,
    revision: str,
    training: dict[str, Any],
) -> Path:
    """Write ``out`` atomically: sharded backbone, head, assets, training record, manifest."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        training = {**training, "copied_assets": copy_assets(base, tmp)}
        write_backbone(tmp, {k: v.detach().to("cpu", dtype).contiguous() for k, v in backbone_state.items()})
        head = {"rm_head.weight": head_weight.detach().to("cpu", dtype).reshape(1, -1).contiguous()}
        if head_bias is not None:
            head["rm_head.bias"] = head_bias.detach().to("cpu", dtype).reshape(1).contiguous()
        save_file(head, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        (tmp / "nvrm_training.json").write_text(json.dumps(training, indent=1, sort_keys=True) + "\n")
        (tmp / "README.md").write_text(
            f"# {out.name}\n\nA WORL-NVRM-style reward model trained with `nvrm train` "
            f"(revision {revision}).\nBase bundle: {training.get('base', {}).get('revision')}. "
            "Training data, settings and held-out metrics are in `nvrm_training.json`.\n"
            "Load it with `nvrm.RewardModel.from_pretrained(path)`.\n"
        )
        write_manifest(tmp, revision=revision)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
