"""``nvrm score``: one candidate continuation."""

from __future__ import annotations

import argparse
import json

from .model_flags import add_model_args, load_model


def add_score_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm score``: model loading, the prompt, the context and one or more candidates."""
    add_model_args(p, backends=True)
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
        doubt = f"uncertainty {result.uncertainty:.4g}, " if result.uncertainty is not None else ""
        print(f"reward {result.reward:+.6g}  ({doubt}{result.num_tokens} tokens, contract {result.contract[:12]})")
    return 0
