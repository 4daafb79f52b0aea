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
    """Write ``out`` atomically: sharded backbone, head, assets, training record, manifest. The training record holds
    ``exported_at`` (UTC, ISO 8601): the order ``nvrm serve --watch`` takes the newest export by, which file-system
    housekeeping cannot change (nvrm.serve.models.model_watch)."""
    from datetime import datetime, timezone

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        exported = datetime.now(timezone.utc).isoformat(timespec="microseconds")
        training = {**training, "copied_assets": copy_assets(base, tmp), "exported_at": exported}
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
        # a reader (nvrm serve --watch) sees the old bundle or the new one, whole: the old one is
        # renamed aside, not deleted in place, and the new one renamed in
        aside = out.parent / f".{out.name}.old-{tmp.name}" if out.exists() else None
        if aside is not None:
            os.replace(out, aside)
        os.replace(tmp, out)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def merged_model(trainer):
    """Merge LoRA into ``trainer``'s backbone and return the runtime model with exactly the weights the
    export stores (parameters in the export dtype; buffers such as the rotary frequencies stay as the
    runtime creates them)."""
    from ..errors import TrainingError
    from ..forward.model import DTYPES, RewardHead
    from ..scoring.loading import head_dtype_for
    from ..scoring.reward_model import RewardModel

    rm = trainer.rm
    for name in trainer.adapted:
        module = getattr(rm.backbone, name)
        if hasattr(module, "merge_and_unload"):
            setattr(rm.backbone, name, module.merge_and_unload())
    backbone = rm.backbone.eval()
    backbone.requires_grad_(False)
    dtype = base_dtype(trainer.base)
    for param in backbone.parameters():
        param.data = param.data.to(dtype)
    bad = [n for n, p in backbone.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad or not bool(torch.isfinite(trainer.head.weight).all()):
        raise TrainingError(f"the trained weights are not finite ({', '.join(bad[:3]) or 'the head'}); no bundle is exported")
    weight = trainer.head.weight.detach().to(dtype).reshape(1, -1)
    bias = trainer.head.bias.detach().to(dtype).reshape(1) if trainer.head.bias is not None else None
    # the head as a load of the export runs it: the backbone is now in the export's dtype, and only a float32
    # backbone runs its head in float32 (scoring.loading.head_dtype_for)
    dtype_name = next(name for name, d in DTYPES.items() if d == dtype)
    head = RewardHead(weight, bias, DTYPES[head_dtype_for(rm.contract, dtype_name)]).to(trainer.device)
    return RewardModel(backbone, head, rm.processor, rm.contract, device=trainer.device, settings=rm.settings, engine=rm.engine)


def export_trained(trainer, out: Path, train_file, eval_file, summary: dict[str, Any]):
    """The trained model as a release-layout bundle at ``out``: (its path, the merged model)."""
    import hashlib

    model = merged_model(trainer)
    state = dict(model.backbone.state_dict())
    digest = hashlib.sha256()
    for k in sorted(state):
        digest.update(k.encode())
        digest.update(state[k].float().cpu().numpy().tobytes())
    digest.update(model.head.weight.float().cpu().numpy().tobytes())
    revision = f"nvrm-train-{digest.hexdigest()[:12]}"
    model.revision = revision
    training = {
        "base": {"path": str(trainer.base), "revision": trainer.rm.revision},
        "config": trainer.cfg.to_dict(),
        "tie_margin": trainer.tau,
        "world_size": trainer.ranks.world,
        "data": {
            "train": {"path": str(train_file), "sha256": _file_digest(Path(train_file))},
            "eval": {"path": str(eval_file), "sha256": _file_digest(Path(eval_file))} if eval_file else None,
        },
        "contract": trainer.rm.fingerprint,
        "summary": summary,
    }
    path = export_bundle(out, base=trainer.base, backbone_state=state, head_weight=trainer.head.weight, head_bias=trainer.head.bias,
                         dtype=base_dtype(trainer.base), revision=revision, training=training)
    return path, model
