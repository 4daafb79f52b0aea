"""``nvrm frames``: the exact frames the model sees, as PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..contract import Contract
from ..errors import BundleError, InputError


def add_frames_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm frames``: an optional bundle (for its contract), the context and/or candidate, and the output directory."""
    p.add_argument("--model", help="bundle whose nvrm_contract.json overrides apply (default: the release contract)")
    p.add_argument("--context", help="preceding video (or image) file")
    p.add_argument("--candidate", help="candidate continuation video file")
    p.add_argument("--out", required=True, help="directory for the PNG frames and frames.json")


def run_frames(args: argparse.Namespace) -> int:
    """Write the exact frames the contract feeds the model (lossless PNG) plus ``frames.json`` listing their times. Returns 0."""
    from ..video.inputs import prepare_input

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
