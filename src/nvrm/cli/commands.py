"""score, frames, verify and download."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..bundle import DEFAULT_REPO, download_bundle, verify_bundle
from ..contract import Contract
from ..errors import BundleError, InputError


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """``--model`` plus one flag per ``LoadSettings`` and ``Limits`` field (cli/options.py)."""
    from ..limits import Limits
    from ..settings import LoadSettings
    from .options import add_dataclass_args

    p.add_argument("--model", required=required, help="bundle directory (or Hub repo id)")
    add_dataclass_args(p, LoadSettings, group="model settings")
    add_dataclass_args(p, Limits, group="limits (checked before the work they protect)")


def settings_from_args(args: argparse.Namespace):
    """The ``LoadSettings`` (with its ``Limits``) the model flags describe."""
    from ..limits import Limits
    from ..settings import LoadSettings
    from .options import dataclass_from_args

    return dataclass_from_args(args, LoadSettings, limits=dataclass_from_args(args, Limits))


def load_model(args: argparse.Namespace):
    """The ``RewardModel`` of ``--model`` with the settings the flags describe."""
    from ..scoring import RewardModel

    return RewardModel.from_pretrained(args.model, settings=settings_from_args(args))


# ------------------------------------------------------------------ score


def add_score_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm score``: model loading, the prompt, the context and one or more candidates."""
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="text prompt")
    p.add_argument("--context", required=True, help="preceding video (or image) file")
    p.add_argument("--candidate", required=True, help="candidate continuation video file (>= 5 s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_score(args: argparse.Namespace) -> int:
    """Score one candidate against the context and print its reward (or one JSON object). Returns 0; bad input raises an NvrmError."""
    model = load_model(args)
    result = model.score(args.prompt, args.context, args.candidate)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(f"reward {result.reward:+.6g}  ({result.num_tokens} tokens, contract {result.contract[:12]})")
    return 0


# ------------------------------------------------------------------ frames


def add_frames_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm frames``: an optional bundle (for its contract), the context and/or candidate, and the output directory."""
    p.add_argument("--model", help="bundle whose nvrm_contract.json overrides apply (default: the release contract)")
    p.add_argument("--context", help="preceding video (or image) file")
    p.add_argument("--candidate", help="candidate continuation video file")
    p.add_argument("--out", required=True, help="directory for the PNG frames and frames.json")


def run_frames(args: argparse.Namespace) -> int:
    """Write the exact frames the contract feeds the model (lossless PNG) plus ``frames.json`` listing their times. Returns 0."""
    from ..inputs import prepare_input

    if not args.context and not args.candidate:
        raise InputError("frames", "give --context and/or --candidate")
    contract = Contract.for_bundle(args.model) if args.model else Contract()
    if args.model and not Path(args.model).is_dir():
        raise BundleError(f"{args.model}: no such bundle directory")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    listing = {"contract": contract.fingerprint, "frames": []}
    for role, value in (("context", args.context), ("candidate", args.candidate)):
        if not value:
            continue
        prepared = prepare_input(value, role, contract)
        for k, (image, t) in enumerate(zip(prepared.images, prepared.times)):
            name = f"{role}_{k:03d}.png"  # PNG is lossless: these are the exact pixels
            image.save(out / name)
            listing["frames"].append({"file": name, "role": role, "source": prepared.source, "time": t, "width": image.width, "height": image.height})
    (out / "frames.json").write_text(json.dumps(listing, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {len(listing['frames'])} frame(s) to {out}")
    return 0


# ------------------------------------------------------------------ verify / download


def add_verify_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm verify``: the bundle directory and ``--no-cache``."""
    p.add_argument("bundle", help="bundle directory")
    p.add_argument("--no-cache", action="store_true", help="re-hash every file instead of using the digest cache")


def run_verify(args: argparse.Namespace) -> int:
    """Check every file of a bundle against its integrity manifest and print the result.

    Returns 1 when the bundle has no manifest; a mismatch raises a ``BundleError`` (exit code 2)."""
    bundle = Path(args.bundle)
    if not bundle.is_dir():
        raise BundleError(f"{bundle}: no such bundle directory")
    report = verify_bundle(bundle, use_cache=not args.no_cache)
    if report.manifest is None:
        print(f"{bundle}: no manifest; nothing verified", file=sys.stderr)
        return 1
    from ..bundle import template_source

    rev = f", revision {report.revision}" if report.revision else ""
    print(f"{bundle}: OK, {report.files_checked} file(s) match {report.manifest}{rev} ({report.cache_hits} from digest cache)")
    print(f"{bundle}: chat template from {template_source(bundle) or 'nowhere (the bundle has none)'}")
    return 0


def add_download_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm download``: repository id, revision and destination."""
    p.add_argument("--repo", default=DEFAULT_REPO, help=f"Hub repo id (default {DEFAULT_REPO})")
    p.add_argument("--revision", help="commit sha to pin (recommended)")
    p.add_argument("--local-dir", help="directory to download into (default: the Hub cache)")


def run_download(args: argparse.Namespace) -> int:
    """Download a release bundle from the model hub (safetensors only) and verify it. Returns 0 on success."""
    path = download_bundle(args.repo, revision=args.revision, local_dir=args.local_dir)
    report = verify_bundle(path)
    print(f"downloaded {args.repo}@{args.revision or 'main'} to {path} ({report.files_checked} file(s) verified)")
    return 0
