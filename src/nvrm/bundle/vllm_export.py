"""A bundle in the layout vLLM loads as ``Qwen3VLForSequenceClassification``, and the check of one against its source.

vLLM's pooling runner (``runner="pooling", convert="classify"``) reads a Hugging Face sequence-classification
checkpoint: the backbone under ``model.language_model.*`` / ``model.visual.*`` (the names
``Qwen3VLForConditionalGeneration`` saves) and the head as ``score.weight`` [1, hidden] with ``score.bias`` [1].
nvrm's release layout keeps the bare ``Qwen3VLModel`` names and the head in ``nvrm_head.safetensors``, which
vLLM cannot load (``no module or parameter named 'embed_tokens'``). The export renames, never changes a value:

- every backbone tensor is written under ``model.`` + its bare name, in the source's dtype, one shard per
  source shard (``lm_head.*`` of a prefixed checkpoint is dropped: the classifier has no LM head);
- the head goes to a shard of its own as ``score.weight`` and ``score.bias`` (zeros when the bundle has no
  bias, the same reward);
- ``config.json`` gets ``architectures: ["Qwen3VLForSequenceClassification"]``, ``num_labels: 1``, ``id2label``
  and an ``nvrm_export`` block naming the source's revision and manifest digest;
- every other file (processor, tokenizer, chat template, ``nvrm_contract.json``) is copied byte for byte.

``NVRM_EXPORT.json`` lists each file's sha256 and size and keeps the source manifest's sha256, so
``verify_export(export, source)`` can show that the export is that release, renamed. Safetensors only.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._version import __version__
from ..errors import BundleError, IntegrityError
from .layout import HEAD_FILE, INDEX_FILE, MANIFEST_NAMES
from .load import backbone_files, canonical_key, load_head, read_config
from .verify import read_integrity_manifest, sha256_file, verify_bundle

if TYPE_CHECKING:  # pragma: no cover - torch is imported where tensors are made (is_export and the manifests need none)
    import torch

EXPORT_MANIFEST = "NVRM_EXPORT.json"
EXPORT_FORMAT = "vllm-sequence-classification"
EXPORT_ARCHITECTURE = "Qwen3VLForSequenceClassification"
LABEL = "reward"
_NOT_COPIED = {"config.json", INDEX_FILE, HEAD_FILE, EXPORT_MANIFEST, *MANIFEST_NAMES}


@dataclass(frozen=True)
class ExportReport:
    """What ``export_vllm`` wrote."""

    path: Path
    tensors: int
    copied: tuple[str, ...]
    source_revision: str | None
    source_manifest_sha256: str | None


def exported_name(key: str) -> str | None:
    """The sequence-classification name of a bundle's backbone key (None: not exported, e.g. ``lm_head.*``)."""
    bare = canonical_key(key)
    return None if bare is None else f"model.{bare}"


def export_config(raw: dict, source_revision: str | None, manifest_sha256: str | None) -> dict:
    """The source ``config.json`` as a one-label sequence classifier (pure: nothing else changes)."""
    out = json.loads(json.dumps(raw))
    out["architectures"] = [EXPORT_ARCHITECTURE]
    out["num_labels"] = 1
    out["id2label"] = {"0": LABEL}
    out["label2id"] = {LABEL: 0}
    out["nvrm_export"] = {"format": EXPORT_FORMAT, "source_revision": source_revision, "source_manifest_sha256": manifest_sha256,
                          "nvrm_version": __version__}
    return out


def _source_manifest(bundle: Path) -> tuple[str | None, str | None, str | None]:
    """(manifest file name, its sha256, the revision it records) of a verified source bundle."""
    manifest = read_integrity_manifest(bundle)
    if manifest is None:
        return None, None, None
    verify_bundle(bundle)  # an export of a tampered bundle would carry the tampering under a clean manifest
    return manifest.name, sha256_file(bundle / manifest.name), manifest.revision


def _write_shards(bundle: Path, out: Path, hidden: int) -> tuple[dict[str, str], int]:
    """Renamed backbone shards and the head shard; returns the index's weight map and the bytes of all tensors."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    sources = backbone_files(bundle)
    total = len(sources) + 1
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for i, file in enumerate(sources):
        name = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        part: dict[str, torch.Tensor] = {}
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                new = exported_name(key)
                if new is None:
                    continue
                if new in weight_map or new in part:
                    raise BundleError(f"{file}: weight {key} appears twice in the bundle; cannot export it")
                part[new] = f.get_tensor(key).contiguous()
        save_file(part, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
        total_bytes += sum(t.numel() * t.element_size() for t in part.values())
    weight, bias = load_head(bundle, hidden)
    bias = bias if bias is not None else torch.zeros(1, dtype=weight.dtype)  # no bias: zero, the same reward
    head = {"score.weight": weight.contiguous(), "score.bias": bias.contiguous()}
    head_name = f"model-{total:05d}-of-{total:05d}.safetensors"
    save_file(head, str(out / head_name), metadata={"format": "pt"})
    total_bytes += sum(t.numel() * t.element_size() for t in head.values())
    weight_map.update({k: head_name for k in head})
    return weight_map, total_bytes


def _copy_assets(bundle: Path, out: Path) -> list[str]:
    copied = _copy_list(bundle)
    for rel in copied:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundle / rel, out / rel)
    return copied


def export_vllm(bundle: str | Path, out: str | Path, *, overwrite: bool = False) -> ExportReport:
    """Write ``bundle`` (release layout) to ``out`` in the layout vLLM loads as ``Qwen3VLForSequenceClassification``.

    The source is verified against its manifest first. ``out`` must not exist (or be empty) unless ``overwrite``."""
    bundle, out = Path(bundle), Path(out)
    if not bundle.is_dir():
        raise BundleError(f"{bundle}: no such bundle directory")
    if out.resolve() == bundle.resolve() or bundle.resolve() in out.resolve().parents:
        raise BundleError(f"{out}: the export must go outside the source bundle {bundle}")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise BundleError(f"{out}: already exists and is not empty; choose another folder or pass --overwrite")
    name, manifest_sha, revision = _source_manifest(bundle)
    raw = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
    config = read_config(bundle)  # the source must be a bundle nvrm can load
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    weight_map, total = _write_shards(bundle, out, config.text_config.hidden_size)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (out / "config.json").write_text(json.dumps(export_config(raw, revision, manifest_sha), indent=2, sort_keys=True) + "\n")
    copied = _copy_assets(bundle, out)
    _write_export_manifest(out, name, manifest_sha, revision, bundle)
    return ExportReport(out, len(weight_map), tuple(copied), revision, manifest_sha)


def _listing(out: Path) -> dict[str, dict]:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != EXPORT_MANIFEST)
    return {p.relative_to(out).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size} for p in files}


def _write_export_manifest(out: Path, name: str | None, manifest_sha: str | None, revision: str | None, source: Path) -> None:
    body = {
        "format": EXPORT_FORMAT,
        "nvrm_version": __version__,
        "source": {"path": str(source.resolve()), "manifest": name, "manifest_sha256": manifest_sha, "revision": revision},
        "files": _listing(out),
    }
    (out / EXPORT_MANIFEST).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def is_export(path: str | Path) -> bool:
    """Whether ``path`` holds an ``nvrm export --vllm`` folder (it has ``NVRM_EXPORT.json``)."""
    return (Path(path) / EXPORT_MANIFEST).is_file()


def read_export_manifest(export: Path) -> dict:
    """``NVRM_EXPORT.json`` of an export, checked for the fields ``verify_export`` reads."""
    path = export / EXPORT_MANIFEST
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read the export manifest ({e})") from e
    if not isinstance(body, dict) or body.get("format") != EXPORT_FORMAT or not isinstance(body.get("files"), dict) \
            or not isinstance(body.get("source"), dict):
        raise BundleError(f"{path}: not an nvrm export manifest (needs format {EXPORT_FORMAT!r}, 'source' and 'files')")
    return body


@dataclass(frozen=True)
class ExportCheck:
    """What ``verify_export`` compared."""

    files: int
    tensors: int
    source: Path
    revision: str | None


def _own_files(export: Path, listed: dict) -> list[str]:
    problems = []
    present = _listing(export)
    for rel, info in listed.items():
        if rel not in present:
            problems.append(f"{rel} is missing")
        elif not isinstance(info, dict) or present[rel] != {"sha256": info.get("sha256"), "size": info.get("size")}:
            problems.append(f"{rel} does not match {EXPORT_MANIFEST}")
    problems += [f"{rel} is not listed in {EXPORT_MANIFEST}" for rel in sorted(set(present) - set(listed))]
    return problems


def _against_source(export: Path, source: Path, recorded: dict) -> tuple[list[str], int]:
    """Problems of an export against its source bundle, and the number of tensors compared."""
    _, manifest_sha, revision = _source_manifest(source)
    if manifest_sha != recorded.get("manifest_sha256"):
        return [f"{source}: its manifest's sha256 is {manifest_sha}, the export was made from {recorded.get('manifest_sha256')}"], 0
    problems = []
    raw = json.loads((source / "config.json").read_text(encoding="utf-8"))
    mine = json.loads((export / "config.json").read_text(encoding="utf-8"))
    if _unversioned(mine) != _unversioned(export_config(raw, revision, manifest_sha)):
        problems.append("config.json is not the source's config.json with the classifier fields")
    for rel in _copy_list(source):
        if not (export / rel).is_file() or sha256_file(export / rel) != sha256_file(source / rel):
            problems.append(f"{rel} differs from the source's")
    tensor_problems, count = _compare_tensors(export, source)
    return problems + tensor_problems, count


def _unversioned(config: dict) -> dict:
    """A config without the nvrm version that wrote it (an export made by another nvrm is the same export)."""
    out = json.loads(json.dumps(config))
    if isinstance(out.get("nvrm_export"), dict):
        out["nvrm_export"].pop("nvrm_version", None)
    return out


def _copy_list(bundle: Path) -> list[str]:
    return [p.relative_to(bundle).as_posix() for p in sorted(bundle.rglob("*")) if p.is_file()
            and p.relative_to(bundle).as_posix() not in _NOT_COPIED and not (p.parent == bundle and p.suffix == ".safetensors")]


def _compare_tensors(export: Path, source: Path) -> tuple[list[str], int]:
    """Every exported tensor equals its source tensor (same name after renaming, dtype, shape and bytes)."""
    import torch
    from safetensors import safe_open

    weight_map = json.loads((export / INDEX_FILE).read_text())["weight_map"]
    handles: dict[str, object] = {}

    def exported(key: str) -> torch.Tensor:
        shard = weight_map[key]
        if shard not in handles:
            handles[shard] = safe_open(str(export / shard), framework="pt", device="cpu")
        return handles[shard].get_tensor(key)  # type: ignore[attr-defined]

    problems, seen = [], set()
    for file in backbone_files(source):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                new = exported_name(key)
                if new is not None:
                    seen.add(new)
                    if new not in weight_map or not _same(exported(new), f.get_tensor(key)):
                        problems.append(f"{new} differs from the source's {key}")
    raw = json.loads((source / "config.json").read_text(encoding="utf-8"))
    weight, bias = load_head(source, int(raw["text_config"]["hidden_size"]))
    want = {"score.weight": weight, "score.bias": bias if bias is not None else torch.zeros(1, dtype=weight.dtype)}
    for key, tensor in want.items():
        seen.add(key)
        if key not in weight_map or not _same(exported(key), tensor):
            problems.append(f"{key} differs from the source's head")
    problems += [f"{key} has no source tensor" for key in sorted(set(weight_map) - seen)]
    return problems, len(seen)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))  # bytes: NaN == NaN, -0 != 0


def verify_export(export: str | Path, source: str | Path | None = None) -> ExportCheck:
    """Check an export's files against ``NVRM_EXPORT.json`` and, tensor by tensor, against its source bundle.

    ``source`` defaults to the path the export recorded. Every problem is reported at once (``IntegrityError``)."""
    export = Path(export)
    body = read_export_manifest(export)
    recorded = body["source"]
    src = Path(source) if source is not None else Path(str(recorded.get("path") or ""))
    if not src.is_dir():
        raise BundleError(f"{export}: its source bundle {src} is not a folder here; pass the source with --source")
    problems = _own_files(export, body["files"])
    tensor_count = 0
    if not problems:
        more, tensor_count = _against_source(export, src, recorded)
        problems += more
    if problems:
        raise IntegrityError(f"{export}: {len(problems)} problem(s) against {EXPORT_MANIFEST} and source {src}: " + "; ".join(problems[:8]))
    return ExportCheck(len(body["files"]), tensor_count, src, recorded.get("revision"))
