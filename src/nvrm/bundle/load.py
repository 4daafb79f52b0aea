"""Loading a bundle strictly: config, backbone weights key by key, the reward head, the processor and its fingerprint.

torch and transformers are imported by the functions that build something, never at import time: ``nvrm verify``
reads the config and the shards' headers (``raw_config``, ``check_weight_shapes``) without either.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BundleError
from .layout import ACCEPTED_ARCHITECTURES, HEAD_FILE, INDEX_FILE
from .verify import DigestCache, read_integrity_manifest, scoring_files

if TYPE_CHECKING:  # pragma: no cover - annotations only
    import torch


def raw_config(bundle: Path) -> dict[str, Any]:
    """``config.json`` as JSON, checked to be a Qwen3-VL config with sizes within ``sizes.LIMITS`` (``BundleError``
    in one line otherwise); torch-free."""
    path = bundle / "config.json"
    if not path.is_file():
        raise BundleError(f"{bundle}: config.json is missing")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise BundleError(f"{path}: not a JSON object")
    from .sizes import config_problems

    problems = config_problems(raw)
    if problems:
        raise BundleError(f"{path}: {'; '.join(problems)}; this is not a Qwen3-VL config nvrm can build (fix config.json or re-download the bundle)")
    archs = raw.get("architectures") or []
    if raw.get("model_type") != "qwen3_vl" or not any(a in ACCEPTED_ARCHITECTURES for a in archs):
        raise BundleError(
            f"{path}: expected model_type 'qwen3_vl' with architecture Qwen3VLModel, "
            f"got model_type={raw.get('model_type')!r}, architectures={archs}"
        )
    return raw


def read_config(bundle: Path):
    """The bundle's ``Qwen3VLConfig``, once ``raw_config`` has checked it."""
    from transformers import Qwen3VLConfig

    raw_config(bundle)
    return Qwen3VLConfig.from_pretrained(str(bundle))


def check_weight_shapes(bundle: Path) -> None:
    """The config's sizes against the shapes the shards declare, before anything is built (a one-line ``BundleError``)."""
    from .sizes import header_shapes, shape_problems

    files = backbone_files(bundle)
    try:
        shapes = header_shapes(files)
    except (OSError, RuntimeError, ValueError) as e:
        raise BundleError(f"{bundle}: a weight shard is not a readable safetensors file ({' '.join(str(e).split())})") from e
    problems = shape_problems(json.loads((bundle / "config.json").read_text(encoding="utf-8")), shapes)
    if problems:
        raise BundleError(f"{bundle}: config.json does not describe these weights: {'; '.join(problems[:4])}")


def backbone_files(bundle: Path) -> list[Path]:
    index = bundle / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise BundleError(f"{index}: unreadable shard index ({e})") from e
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise BundleError(f"{index}: weight_map must map weight names to shard file names")
        names = sorted(set(weight_map.values()))
        root = bundle.resolve()
        for n in names:
            target = (bundle / n).resolve()
            if Path(n).is_absolute() or ".." in Path(n).parts or root not in target.parents:
                raise BundleError(f"{index}: shard {n!r} lies outside the bundle; shard names must be files in the bundle folder")
        missing = [n for n in names if not (bundle / n).is_file()]
        if missing:
            raise BundleError(f"{bundle}: shard(s) listed in {INDEX_FILE} are missing: {', '.join(missing)}")
        return [bundle / n for n in names]
    single = bundle / "model.safetensors"
    if single.is_file():
        return [single]
    pickles = [p.name for p in bundle.glob("*.bin")] + [p.name for p in bundle.glob("*.pt")]
    hint = f" (found {', '.join(pickles)}: pickle checkpoints are refused; convert to safetensors)" if pickles else ""
    raise BundleError(f"{bundle}: no backbone weights ({INDEX_FILE} or model.safetensors){hint}")


def canonical_key(key: str) -> str | None:
    """Map a checkpoint key to the bare ``Qwen3VLModel`` layout; None = ignore."""
    if key.startswith("lm_head."):
        return None
    if key.startswith("model."):
        return key[len("model.") :]
    return key


def _summarise(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def load_backbone(bundle: Path, config, dtype: torch.dtype, attn_implementation: str = "sdpa"):
    """Qwen3VLModel with every weight from the bundle, checked key by key."""
    from accelerate import init_empty_weights
    from safetensors import safe_open
    from ..forward.compat import build_backbone

    check_weight_shapes(bundle)
    with init_empty_weights(include_buffers=False):  # parameters on meta, rotary buffers real
        model = build_backbone(config, attn_implementation, dtype)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    state: dict[str, torch.Tensor] = {}
    unexpected, wrong_shape, duplicates = [], [], []
    for file in backbone_files(bundle):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    name = canonical_key(key)
                    if name is None:
                        continue
                    if name not in expected:
                        unexpected.append(key)
                        continue
                    if name in state:
                        duplicates.append(key)
                        continue
                    tensor = f.get_tensor(key)
                    if tuple(tensor.shape) != expected[name]:
                        wrong_shape.append(f"{key} {tuple(tensor.shape)} != {expected[name]}")
                        continue
                    state[name] = tensor.to(dtype)
        except (OSError, RuntimeError, ValueError) as e:
            if isinstance(e, BundleError):
                raise
            raise BundleError(f"{file}: not a readable safetensors file ({' '.join(str(e).split())})") from e
    missing = sorted(set(expected) - set(state))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} weight(s): {_summarise(missing)}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} weight(s): {_summarise(sorted(unexpected))}")
    if wrong_shape:
        problems.append(f"wrong shape: {_summarise(wrong_shape)}")
    if duplicates:
        problems.append(f"duplicated: {_summarise(sorted(duplicates))}")
    if problems:
        raise BundleError(f"{bundle}: backbone does not match config.json: " + "; ".join(problems))
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    model.requires_grad_(False)
    return model


def load_head(bundle: Path, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``rm_head.weight`` [1, hidden] and the optional ``rm_head.bias`` [1]."""
    from safetensors import safe_open

    path = bundle / HEAD_FILE
    if not path.is_file():
        raise BundleError(f"{bundle}: reward head {HEAD_FILE} is missing")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, RuntimeError, ValueError) as e:
        raise BundleError(f"{path}: not a readable safetensors file ({' '.join(str(e).split())})") from e
    extra = sorted(set(tensors) - {"rm_head.weight", "rm_head.bias"})
    if "rm_head.weight" not in tensors:
        raise BundleError(f"{path}: key rm_head.weight is missing (found: {', '.join(sorted(tensors)) or 'nothing'})")
    if extra:
        raise BundleError(f"{path}: unexpected key(s) {', '.join(extra)}; expected rm_head.weight [+ rm_head.bias]")
    weight, bias = tensors["rm_head.weight"], tensors.get("rm_head.bias")
    if tuple(weight.shape) != (1, hidden_size):
        raise BundleError(f"{path}: rm_head.weight has shape {tuple(weight.shape)}, expected (1, {hidden_size})")
    if bias is not None and tuple(bias.shape) != (1,):
        raise BundleError(f"{path}: rm_head.bias has shape {tuple(bias.shape)}, expected (1,)")
    return weight, bias


def template_source(bundle: Path) -> str | None:
    """Which file the runtime's chat template comes from (transformers' precedence, then the
    tokenizer's template as the fallback); None when the bundle has none."""
    for name in ("chat_template.jinja", "chat_template.json"):
        if (bundle / name).is_file():
            return name
    for name in ("processor_config.json", "tokenizer_config.json"):
        try:
            if "chat_template" in json.loads((bundle / name).read_text(encoding="utf-8")):
                return name
        except (OSError, ValueError, TypeError):
            continue
    return None


def load_processor(bundle: Path):
    """The bundle's processor, with its chat template: ``chat_template.jinja`` / ``.json`` (or the
    processor config), else the tokenizer's own template from ``tokenizer_config.json``.

    Sets ``processor._nvrm_template_source`` to the file it came from.
    """
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(str(bundle), trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:
        raise BundleError(f"{bundle}: cannot load processor/tokenizer assets ({' '.join(str(e).split())[:300]})") from e
    if getattr(processor, "chat_template", None) is None:
        fallback = getattr(processor.tokenizer, "chat_template", None)
        if not fallback:
            raise BundleError(
                f"{bundle}: no chat template (looked for chat_template.jinja, chat_template.json, "
                "processor_config.json and the tokenizer's template in tokenizer_config.json)"
            )
        processor.chat_template = fallback if isinstance(fallback, str) else dict(fallback)
    processor._nvrm_template_source = template_source(bundle) or "tokenizer_config.json"
    return processor


def preprocessing_fingerprint(bundle: Path, contract) -> str:
    """sha256 over the contract and every processor, tokenizer and template file the bundle has.

    Two rewards are comparable when this agrees: the same frames, the same
    layout, the same tokens (weights are covered by the manifest revision).
    """
    h = hashlib.sha256(contract.to_json().encode("ascii"))
    for name in scoring_files(bundle):
        if name.endswith(".safetensors") or name in ("config.json", INDEX_FILE, HEAD_FILE):
            continue
        h.update(f"\n{name}\n".encode())
        h.update(hashlib.sha256((bundle / name).read_bytes()).digest())
    return h.hexdigest()


WEIGHT_FILES = ("config.json", INDEX_FILE, HEAD_FILE)
"""Besides the backbone shards, the files that define what the weights compute."""


def weights_fingerprint(bundle: str | Path) -> str:
    """sha256 over the name and sha256 of every file that defines the weights (the backbone shards, the head,
    ``config.json`` and the shard index): what a guard fitted for these weights records. A file the manifest
    lists is taken at the manifest's digest (checked on a verified load); any other is hashed (digest cache)."""
    bundle = Path(bundle)
    manifest = read_integrity_manifest(bundle)
    listed = {e.path: e.sha256 for e in manifest.entries} if manifest else {}
    names = sorted({p.name for p in backbone_files(bundle)} | {n for n in WEIGHT_FILES if (bundle / n).is_file()})
    cache = None
    h = hashlib.sha256()
    for name in names:
        digest = listed.get(name)
        if digest is None:
            cache = cache or DigestCache()
            digest = cache.digest(bundle / name)
        h.update(f"{name}\n{digest}\n".encode())
    if cache is not None:
        cache.save()
    return h.hexdigest()
