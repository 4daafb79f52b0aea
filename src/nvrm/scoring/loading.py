"""Loading a reward model: settings resolved, the bundle verified and read, the parts on the device.

``load_parts`` returns the keyword arguments of ``RewardModel(...)``; ``RewardModel.from_pretrained``
is that and nothing more.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..bundle import load_backbone, load_head, read_config, read_integrity_manifest, resolve_bundle, verify_bundle
from ..contract import Contract
from ..engine.selfcheck import load_checked_processor
from ..errors import ConfigError, NvrmError
from ..forward.model import DTYPES, RewardHead
from ..forward.cpu_attention import ensure_cpu_sdpa
from ..settings import LoadSettings

CPU_BATCH_TOKENS = 16384
"""The key-position budget of one forward on the CPU (``LoadSettings.max_batch_tokens`` default there)."""


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is visible, else ``cpu``: the device ``from_pretrained`` uses when none is given."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_batch_tokens(device: torch.device, config) -> int:
    """The key-position budget of a forward pass: 16,384 on CPU; on CUDA a quarter of free memory's worth of KV."""
    if device.type != "cuda":
        return CPU_BATCH_TOKENS
    text = config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_bytes = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * 2  # bf16 K and V per position
    free, _ = torch.cuda.mem_get_info(device)
    return int(max(CPU_BATCH_TOKENS, min(262144, free // 4 // kv_bytes)))


def default_attention(device: torch.device) -> str:
    """flash_attention_2 on CUDA when it is installed, else SDPA."""
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def check_device(name: str) -> torch.device:
    """The torch device ``name``, if this machine has it; a ``ConfigError`` naming it and the fix otherwise."""
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"device={name!r} is not a torch device ({' '.join(str(e).split())[:120]}); use cpu, cuda or cuda:N") from e
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device={name!r}: torch sees no CUDA device on this machine; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"device={name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    elif dev.type not in ("cpu", "meta") and not getattr(torch, dev.type, None):
        raise ConfigError(f"device={name!r}: this torch has no {dev.type} backend; use cpu or cuda")
    return dev


def check_attention(attn: str, dev: torch.device) -> None:
    """flash_attention_2 needs the flash_attn package and a CUDA device; refused clearly otherwise."""
    if attn != "flash_attention_2":
        return
    if dev.type != "cuda":
        raise ConfigError(f"attention='flash_attention_2' runs only on CUDA, and the device is {dev}; use --attention sdpa")
    try:
        import flash_attn  # noqa: F401
    except ImportError as e:
        raise ConfigError("attention='flash_attention_2': the flash_attn package is not installed; install it or use --attention sdpa") from e


def manifest_revision(path) -> str | None:
    """The revision a bundle's manifest records, if any (unverified loads)."""
    try:
        m = read_integrity_manifest(path)
    except NvrmError:
        return None
    return m.revision if m else None


def resolve_settings(settings: LoadSettings | None, shortcuts: dict[str, Any], overrides: dict[str, Any]) -> LoadSettings:
    """``settings`` with the ``from_pretrained`` shortcuts and keyword overrides applied."""
    settings = settings or LoadSettings()
    device, dtype = shortcuts.pop("device", None), shortcuts.pop("dtype", None)
    if device is not None:
        shortcuts["device"] = str(device)
    if dtype is not None:
        shortcuts["dtype"] = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    return settings.replace(**{k: v for k, v in {**shortcuts, **overrides}.items() if v is not None})


def head_dtype_for(contract: Contract, dtype: str) -> str:
    """The dtype the reward head runs in for a backbone in ``dtype``: a float32 run is float32 throughout.

    The release's reward is the bfloat16 head's logit (``contract.head_dtype``); a float32 backbone under that
    head still rounded every reward to bfloat16 (5e-3 from a float32 reference). So ``dtype="float32"`` runs
    the head in float32 too; bfloat16 and float16 runs keep the contract's. Like the backbone's dtype, this is
    a run setting: the contract and its (preprocessing) fingerprint are unchanged, since the frames and tokens
    are the same. docs/contract.md ("Float32 runs")."""
    return "float32" if dtype == "float32" else contract.head_dtype


def load_parts(path_or_repo: str | os.PathLike, settings: LoadSettings, contract: Contract | None = None) -> dict[str, Any]:
    """Everything ``RewardModel(...)`` takes, loaded from a bundle (verified unless the settings say not to)."""
    path = resolve_bundle(path_or_repo, settings.revision)
    report = verify_bundle(path) if settings.verify else None
    config = read_config(path)
    contract = contract or Contract.for_bundle(path)
    dev = check_device(settings.device) if settings.device else default_device()
    attn = settings.attention or default_attention(dev)
    check_attention(attn, dev)
    if ensure_cpu_sdpa() and settings.compile and dev.type == "cpu":
        raise ConfigError(
            f"compile={settings.compile!r}: with ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')} on this AMX CPU, "
            "torch 2.14's compiled attention crashes or returns NaN; run without --compile, or without lowering the capability"
        )
    backbone = load_backbone(path, config, DTYPES[settings.dtype], attn)
    weight, bias = load_head(path, config.text_config.hidden_size)
    head = RewardHead(weight, bias, DTYPES[head_dtype_for(contract, settings.dtype)])
    processor = load_checked_processor(path)  # transformers' token ids and pixels on a fixed fixture, as the release profile gave them
    revision = report.revision if report else manifest_revision(path)
    backbone.to(dev)
    head.to(dev)
    if settings.compile:
        mode = settings.compile if isinstance(settings.compile, str) else None
        backbone.language_model.compile(dynamic=True, mode=mode)
    from ..bundle import preprocessing_fingerprint
    from ..guard.sidecar import read_bundle_guard

    own = Contract.for_bundle(path)
    preprocessing = preprocessing_fingerprint(path, contract)
    guard = read_bundle_guard(path, preprocessing, dev, own_preprocessing=None if contract == own else preprocessing_fingerprint(path, own))
    wanted = settings.members or settings.member_rate > 0
    members = _load_members(path, config, settings, dev, attn, guard, contract, preprocessing) if wanted else ()
    return {
        "guard": guard,
        "members": members,
        "backbone": backbone,
        "head": head,
        "processor": processor,
        "contract": contract,
        "device": dev,
        "revision": revision or settings.revision,
        "path": path,
        "settings": settings,
    }


def _load_members(path, config, settings: LoadSettings, dev, attn: str, guard, contract: Contract, preprocessing: str) -> tuple:
    """``(name, backbone, head, calibration)`` of every member in ``path/nvrm_members`` (``members=True``, or a
    ``member_rate``), each checked against the bundle's weights, preprocessing and architecture; a bundle without a
    guard or without members is refused."""
    from ..bundle import weights_fingerprint
    from ..guard.members import MEMBERS_DIR, bundle_config, check_member, member_folders

    asked, flag = ("members=True", "--members") if settings.members else (f"member_rate={settings.member_rate:g}", "--member-rate")
    if guard is None:
        raise ConfigError(f"{asked}: {path} has no guard under this contract; members are the guard's opt-in check (fit one with nvrm guard fit)")
    folders = member_folders(path)
    if not folders:
        raise ConfigError(f"{asked}: {path} has no members ({MEMBERS_DIR}/NAME); add one with nvrm guard member, or drop {flag}")
    weights, own = weights_fingerprint(path), bundle_config(path)
    out = []
    for folder in folders:
        cal = check_member(folder, model=weights, preprocessing=preprocessing, config=own)
        backbone = load_backbone(folder, config, DTYPES[settings.dtype], attn)
        weight, bias = load_head(folder, config.text_config.hidden_size)
        head = RewardHead(weight, bias, DTYPES[head_dtype_for(contract, settings.dtype)])
        backbone.to(dev)
        head.to(dev)
        out.append((folder.name, backbone, head, cal))
    return tuple(out)
