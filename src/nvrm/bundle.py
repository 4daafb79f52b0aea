"""Find, verify and load a WORL-NVRM bundle (release layout).

Layout: ``config.json`` (``Qwen3VLModel``), ``model-0000X-of-0000N.safetensors``
with ``model.safetensors.index.json`` (or one ``model.safetensors``),
``nvrm_head.safetensors`` (``rm_head.weight`` [1, hidden], optional
``rm_head.bias``), processor/tokenizer assets with the chat template, and
optionally ``RELEASE_MANIFEST.json`` / ``worl-bundle.json`` and
``nvrm_contract.json``.

Only safetensors are read (never pickle), no remote code runs, and loading is
strict: a missing, unexpected or mis-shaped weight is an error naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

import torch

from .errors import BundleError, DownloadError, IntegrityError

log = logging.getLogger(__name__)

MANIFEST_NAMES = ("RELEASE_MANIFEST.json", "worl-bundle.json")
HEAD_FILE = "nvrm_head.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_REPO = "Efficient-Large-Model/WORL-NVRM"
ACCEPTED_ARCHITECTURES = ("Qwen3VLModel", "Qwen3VLForConditionalGeneration")


def cache_dir() -> Path:
    """nvrm's own cache (digests, demo bundle): $NVRM_CACHE_DIR or ~/.cache/nvrm."""
    env = os.environ.get("NVRM_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nvrm"


# ---------------------------------------------------------------- manifests


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class IntegrityManifest:
    name: str
    entries: tuple[ManifestEntry, ...]
    revision: str | None


def read_integrity_manifest(bundle: Path) -> IntegrityManifest | None:
    """Parse the first manifest found; both the dict and the list forms are accepted."""
    for name in MANIFEST_NAMES:
        path = bundle / name
        if path.is_file():
            break
    else:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: manifest is not valid JSON ({e})") from e
    files = data.get("files") if isinstance(data, dict) else None
    raw: Iterable[tuple[str, Any]]
    if isinstance(files, dict):
        raw = files.items()
    elif isinstance(files, list):
        raw = [(item.get("path") if isinstance(item, dict) else None, item) for item in files]
    else:
        raise BundleError(f"{path}: manifest needs a 'files' object or list, got {type(files).__name__}")
    entries = []
    for rel, info in raw:
        if not isinstance(rel, str) or not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            raise BundleError(f"{path}: manifest entry {rel!r} needs a path and a sha256")
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(f"{path}: manifest path {rel!r} leaves the bundle")
        size = info.get("size")
        entries.append(ManifestEntry(rel, info["sha256"].lower(), int(size) if size is not None else None))
    source = data.get("source") if isinstance(data.get("source"), dict) else {}
    revision = source.get("revision") or data.get("revision")
    return IntegrityManifest(name, tuple(entries), str(revision) if revision else None)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class DigestCache:
    """sha256 digests of unchanged files, so a 9 GB bundle is hashed once, not on every load.

    The key is (absolute path, size, mtime, ctime, inode). ``touch -r`` can
    restore a file's mtime after an edit but not its ctime, which the kernel
    sets on every change and user space cannot set back; replacing the file
    changes its inode. Threat model: this catches accidental and ordinary
    tampering (an edited, copied-over or replaced file). It does not stand
    against someone who can reset the system clock or write the raw disk
    (root): use ``verify --no-cache`` (``use_cache=False``) to hash every byte.
    """

    def __init__(self, path: Path | None = None):
        self.path = path or (cache_dir() / "digests.json")
        try:
            self._data: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._data = {}
        self.hits = 0

    @staticmethod
    def _key(file: Path) -> str:
        st = file.stat()
        return f"{file.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"

    def digest(self, file: Path) -> str:
        key = self._key(file)
        if key in self._data:
            self.hits += 1
            return self._data[key]
        self._data[key] = sha256_file(file)
        return self._data[key]

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self._data, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:  # a read-only cache only costs speed
            log.warning("could not save digest cache %s: %s", self.path, e)


@dataclass(frozen=True)
class VerifyReport:
    manifest: str | None
    files_checked: int
    cache_hits: int
    revision: str | None


# Files whose presence changes what the runtime computes. In verified mode each
# one that exists must be listed in the manifest.
SCORING_FILES = (
    "config.json",
    INDEX_FILE,
    HEAD_FILE,
    "nvrm_contract.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
)


def scoring_files(bundle: Path) -> list[str]:
    """Relative paths of every file present that can change a score (weights, configs, processor, template)."""
    names = {n for n in SCORING_FILES if (bundle / n).is_file()}
    names |= {p.name for p in bundle.glob("*.safetensors") if p.is_file()}
    templates = bundle / "chat_templates"
    if templates.is_dir():
        names |= {p.relative_to(bundle).as_posix() for p in templates.rglob("*") if p.is_file()}
    return sorted(names)


def verify_bundle(bundle: str | Path, *, use_cache: bool = True) -> VerifyReport:
    """Check every manifest entry's size and sha256; all mismatches are reported at once."""
    bundle = Path(bundle)
    manifest = read_integrity_manifest(bundle)
    if manifest is None:
        warnings.warn(f"{bundle}: no RELEASE_MANIFEST.json or worl-bundle.json; files are not verified", stacklevel=2)
        return VerifyReport(None, 0, 0, None)
    cache = DigestCache() if use_cache else DigestCache(Path(os.devnull))
    problems = []
    for entry in manifest.entries:
        file = bundle / entry.path
        if not file.is_file():
            problems.append(f"{entry.path} is missing")
            continue
        size = file.stat().st_size
        if entry.size is not None and size != entry.size:
            problems.append(f"{entry.path} is {size} bytes, manifest says {entry.size}")
            continue
        if cache.digest(file) != entry.sha256:
            problems.append(f"{entry.path} sha256 does not match the manifest")
    listed = {e.path for e in manifest.entries}
    for name in scoring_files(bundle):
        if name not in listed:
            problems.append(f"{name} is not listed (in verified mode only listed files may affect scoring; remove it or add it to the manifest)")
    if use_cache:
        cache.save()
    if problems:
        raise IntegrityError(
            f"{bundle}: {len(problems)} file(s) fail {manifest.name}: " + "; ".join(problems)
            + " (re-download the bundle, or pass --no-verify / verify=False to skip)"
        )
    return VerifyReport(manifest.name, len(manifest.entries), cache.hits, manifest.revision)


# ---------------------------------------------------------------- locating


def resolve_bundle(path_or_repo: str | os.PathLike, revision: str | None = None) -> Path:
    """A local bundle directory, or a Hub repo id downloaded at ``revision``."""
    path = Path(path_or_repo)
    if path.exists():
        if not path.is_dir():
            raise BundleError(f"{path}: a bundle is a directory, got a file")
        return path
    text = str(path_or_repo)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        return download_bundle(text, revision=revision)
    raise BundleError(f"{text}: no such bundle directory (and not a Hub repo id like {DEFAULT_REPO})")


def download_bundle(
    repo: str = DEFAULT_REPO,
    revision: str | None = None,
    local_dir: str | Path | None = None,
    *,
    connect_timeout: float = 10.0,
    read_timeout: float = 30.0,
) -> Path:
    """Download a bundle with huggingface_hub, pinned to ``revision``; fail fast offline.

    Args:
        repo: Hub repo id.
        revision: commit sha to pin (recommended).
        local_dir: download into this folder instead of the Hub cache.
        connect_timeout: seconds for each metadata (etag) request.
        read_timeout: seconds without progress before a file download fails.

    Returns:
        The local bundle folder.
    """
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

        # huggingface_hub reads its download timeout from this constant at call time and takes no
        # argument for it; the environment variable would be read too late (at its import)
        if "HF_HUB_DOWNLOAD_TIMEOUT" not in os.environ:
            constants.HF_HUB_DOWNLOAD_TIMEOUT = read_timeout
        where = snapshot_download(
            repo_id=repo,
            revision=revision,
            local_dir=str(local_dir) if local_dir else None,
            etag_timeout=connect_timeout,
            allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.md"],
        )
    except (LocalEntryNotFoundError, RepositoryNotFoundError, HfHubHTTPError, OSError) as e:
        reason = " ".join(str(e).split())[:300]
        raise DownloadError(
            f"cannot download {repo}@{revision or 'main'} from the Hugging Face Hub ({type(e).__name__}: {reason}); "
            "check network access, or copy the bundle to a directory and pass its path"
        ) from e
    return Path(where)


# ---------------------------------------------------------------- loading


def read_config(bundle: Path):
    from transformers import Qwen3VLConfig

    path = bundle / "config.json"
    if not path.is_file():
        raise BundleError(f"{bundle}: config.json is missing")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: not valid JSON ({e})") from e
    archs = raw.get("architectures") or []
    if raw.get("model_type") != "qwen3_vl" or not any(a in ACCEPTED_ARCHITECTURES for a in archs):
        raise BundleError(
            f"{path}: expected model_type 'qwen3_vl' with architecture Qwen3VLModel, "
            f"got model_type={raw.get('model_type')!r}, architectures={archs}"
        )
    return Qwen3VLConfig.from_pretrained(str(bundle))


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


def _canonical_key(key: str) -> str | None:
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
    from transformers import Qwen3VLModel

    with init_empty_weights(include_buffers=False):  # parameters on meta, rotary buffers real
        model = Qwen3VLModel._from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    state: dict[str, torch.Tensor] = {}
    unexpected, wrong_shape, duplicates = [], [], []
    for file in backbone_files(bundle):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    name = _canonical_key(key)
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


# ------------------------------------------------------------------ writing bundles


def write_manifest(
    bundle: Path,
    name: str = "RELEASE_MANIFEST.json",
    style: Literal["dict", "list"] = "dict",
    revision: str | None = None,
) -> Path:
    """Record sha256 and size of every file in ``bundle`` (except manifests)."""
    skip = {"RELEASE_MANIFEST.json", "worl-bundle.json"}
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name not in skip)
    entries = {p.relative_to(bundle).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size} for p in files}
    if style == "dict":
        body: dict = {"files": entries}
    else:
        body = {"files": [{"path": k, **v} for k, v in entries.items()]}
    if revision is not None:
        body["source"] = {"revision": revision}
    path = bundle / name
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    return path


def write_backbone(
    bundle: Path, state: dict[str, torch.Tensor], shards: int | None = None, max_shard_bytes: int = 2 * 1024**3
) -> None:
    """Sharded safetensors + ``model.safetensors.index.json`` (``shards`` fixed, or by size)."""
    from safetensors.torch import save_file

    keys = sorted(state)
    if shards is None:
        total_bytes = sum(state[k].numel() * state[k].element_size() for k in keys)
        shards = max(1, -(-total_bytes // max_shard_bytes))
    per = -(-len(keys) // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[s * per : (s + 1) * per]}
        save_file(part, str(bundle / fname), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (bundle / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
