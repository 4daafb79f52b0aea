"""The guard's opt-in check: members, reward models that truly differ from the bundle's (docs/hacking.md).

The default guard reads what the bundle's one forward computed; it prices hacks that change how frames look, not
a change of content that the model itself over-rates. A member is another reward model of the same architecture
and preprocessing, trained on other data or from another seed (``nvrm train``), so it is wrong in other places. It is
stored in the bundle, beside the release's files and never instead of them:

    nvrm_members/NAME/config.json, the backbone shards, nvrm_head.safetensors   (the member's own weights)
    nvrm_members/NAME/nvrm_member.json                                           (its calibration, below)

every file listed in the bundle's manifest. A Bradley-Terry reward is defined up to a scale and a shift, so each
member's rewards are put in the bundle's units by a line fitted on genuine candidates (``scale * r + shift``, the
least-squares fit of the bundle's rewards on the member's). Members disagree a little on genuine candidates too, so a
member doubts a reward only by what it exceeds the member's calibrated reward beyond ``margin`` (the 95th percentile of
that excess on the calibration candidates). Loaded with ``members=True``, every item also runs each member's forward
on the same encoded inputs, and its uncertainty becomes

    max(the guard's uncertainty, reward - min over members of (scale * member's reward + shift + margin))

so the conservative reward at λ = 1 is the least of the guard's conservative reward and every member's bar: the
worst case of an ensemble (Coste et al., ICLR 2024). The reward itself stays the bundle's, bit for bit. Each member
costs one forward per item (and one backward in ``differentiable``).

Torch is needed only by ``doubt``; the rest is files and numbers.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import BundleError, InputError

MEMBERS_DIR = "nvrm_members"
"""The folder of a bundle's members."""
MEMBER_FILE = "nvrm_member.json"
"""A member's calibration and fingerprints, in its folder."""
FORMAT = "nvrm-member"
VERSION = 1
MIN_CANDIDATES = 8
"""Genuine candidates a calibration needs at least."""
MARGIN_QUANTILE = 0.95
"""A member doubts a reward by what it exceeds its calibrated reward beyond this quantile of the genuine excess."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Calibration:
    """A member in the bundle's units, and what it was fitted for."""

    scale: float
    shift: float
    margin: float
    """How far the bundle's reward may exceed the member's calibrated one before the member doubts it: the 95th percentile of
    that excess on the calibration candidates (members disagree a little on genuine candidates too)."""
    corr: float
    """Correlation of the member's rewards with the bundle's on the calibration candidates."""
    candidates: int
    model: str
    """The bundle's weights fingerprint."""
    member: str
    """The member's weights fingerprint."""
    preprocessing: str
    """The preprocessing both were read under."""

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> "Calibration":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise BundleError(f"{path}: not a readable member calibration ({' '.join(str(e).split())}); add the member again with nvrm guard member") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            raise BundleError(f"{path}: not an {FORMAT} file of version {VERSION}; add the member again with nvrm guard member")
        try:
            out = cls(float(data["scale"]), float(data["shift"]), float(data["margin"]), float(data["corr"]), int(data["candidates"]),
                      str(data["model"]), str(data["member"]), str(data["preprocessing"]))
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{path}: field {e} is missing or malformed; add the member again with nvrm guard member") from e
        if not (math.isfinite(out.scale) and math.isfinite(out.shift) and math.isfinite(out.margin)) or out.scale <= 0 or out.margin < 0:
            raise BundleError(f"{path}: scale {out.scale}, shift {out.shift} and margin {out.margin} must be finite, the scale > 0 and the margin >= 0")
        return out


@dataclass(frozen=True)
class Member:
    """A loaded member: its forward runtime (its own backbone and head, the bundle's codec and device) and its calibration."""

    name: str
    runtime: Any
    scale: float
    shift: float
    margin: float = 0.0

    def bar(self, reward: Any) -> Any:
        """The member's ``reward`` (raw) as the bar the bundle's reward is doubted above: ``scale * reward + shift + margin``."""
        return self.scale * reward + self.shift + self.margin


def fit_calibration(bundle_rewards: Sequence[float], member_rewards: Sequence[float], *, model: str, member: str,
                    preprocessing: str, where: str = "pairs") -> Calibration:
    """The least-squares line from a member's rewards to the bundle's, on the same genuine candidates (pure)."""
    x = [float(v) for v in member_rewards]
    y = [float(v) for v in bundle_rewards]
    if len(x) != len(y):
        raise ValueError("one reward per candidate from each model")
    if len(x) < MIN_CANDIDATES:
        raise InputError(where, f"{len(x)} candidate(s) scored by both models; a member's calibration needs at least {MIN_CANDIDATES}")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    if sxx <= 0 or syy <= 0:
        raise InputError(where, "every candidate got the same reward from one of the models, so the member cannot be put in the bundle's units; "
                                "give candidates of different quality")
    scale = sxy / sxx
    if scale <= 0:
        raise InputError(where, f"the member's rewards fall as the bundle's rise (correlation {sxy / math.sqrt(sxx * syy):.2f} over {len(x)} "
                                "candidates): it does not model the same preference; train it on the same kind of pairs")
    shift = my - scale * mx
    excess = sorted(b - (scale * a + shift) for a, b in zip(x, y))
    margin = max(0.0, excess[min(len(excess) - 1, int(math.ceil(MARGIN_QUANTILE * len(excess))) - 1)])
    return Calibration(scale, shift, margin, sxy / math.sqrt(sxx * syy), len(x), model, member, preprocessing)


def member_folders(bundle: str | Path) -> list[Path]:
    """The bundle's member folders (those holding a calibration), by name."""
    root = Path(bundle) / MEMBERS_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / MEMBER_FILE).exists())


def check_member(folder: Path, *, model: str, preprocessing: str, config: dict[str, Any]) -> Calibration:
    """A member folder's calibration, once it is known to belong to these weights and preprocessing and to have this
    architecture (``config``: the bundle's config.json); one line naming both sides otherwise."""
    from ..bundle import weights_fingerprint

    cal = Calibration.read(folder / MEMBER_FILE)
    if cal.model != model or cal.preprocessing != preprocessing:
        raise BundleError(f"{folder}: this member was calibrated for weights {cal.model[:16]} under preprocessing {cal.preprocessing[:16]}; the model "
                          f"is {model[:16]} under {preprocessing[:16]} (add it again with nvrm guard member)")
    check_architecture(folder, config)
    weights = weights_fingerprint(folder)
    if weights != cal.member:
        raise BundleError(f"{folder}: its weights are {weights[:16]}, its calibration was fitted for {cal.member[:16]}; add it again with nvrm guard member")
    return cal


def _config(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BundleError(f"{folder / 'config.json'}: not readable ({' '.join(str(e).split())})") from e
    if not isinstance(data, dict):
        raise BundleError(f"{folder / 'config.json'}: not a JSON object")
    return {k: v for k, v in data.items() if not k.startswith("_") and k not in ("transformers_version", "torch_dtype", "dtype")}


def bundle_config(bundle: str | Path) -> dict[str, Any]:
    """The bundle's config.json as members are compared with it (bookkeeping fields left out)."""
    return _config(Path(bundle))


def check_architecture(folder: str | Path, config: dict[str, Any], bundle: str = "the bundle's") -> None:
    """One line naming the fields that differ when ``folder``'s config.json is not ``config`` (``bundle_config`` of the bundle)."""
    own = _config(Path(folder))
    if own != config:
        keys = sorted(k for k in set(own) | set(config) if own.get(k) != config.get(k))
        raise BundleError(f"{folder}: its config.json differs from {bundle} ({', '.join(keys[:4])}); a member must have the bundle's architecture")


def write_member(bundle: str | Path, name: str, member_bundle: str | Path, calibration: Calibration) -> Path:
    """Copy ``member_bundle``'s config, backbone shards and head into ``bundle/nvrm_members/name`` (replacing a member of
    that name), write its calibration, and list every file in the bundle's manifest. Returns the folder."""
    from ..bundle.layout import HEAD_FILE, MANIFEST_NAMES
    from ..bundle.load import backbone_files
    from .sidecar import list_in_manifest, unlist_in_manifest

    if not _NAME.match(name):
        raise InputError(f"member name {name!r}", "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    bundle, source = Path(bundle), Path(member_bundle)
    folder = bundle / MEMBERS_DIR / name
    tmp = bundle / MEMBERS_DIR / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = [source / "config.json", *backbone_files(source), source / HEAD_FILE]
    index = source / "model.safetensors.index.json"
    if index.is_file():
        files.append(index)
    for f in files:
        shutil.copyfile(f, tmp / f.name)
    (tmp / MEMBER_FILE).write_text(calibration.to_json(), encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    for manifest_name in MANIFEST_NAMES:
        manifest = bundle / manifest_name
        if manifest.is_file():
            unlist_in_manifest(manifest, f"{MEMBERS_DIR}/{name}/")  # a replaced member's files go with it
            for f in sorted(folder.iterdir()):
                list_in_manifest(manifest, f, bundle)
            break
    return folder


def doubt(uncertainty: Any, reward: Any, calibrated: Any) -> Any:
    """``max(uncertainty, reward - min over members)`` (torch, with the graph): ``calibrated`` [K, B] the members' bars
    (``Member.bar``), ``reward`` and ``uncertainty`` [B]."""
    import torch

    spread = (reward - calibrated.min(0).values).clamp_min(0)
    return torch.maximum(uncertainty, spread)
