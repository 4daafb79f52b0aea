"""``nvrm guard``: fit a bundle's guard (how far to trust each reward) from preference pairs, or show the one it has."""

from __future__ import annotations

import argparse
import json
import sys

from .options import DeferredParser


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm guard``: ``fit`` (the model's flags, the pairs, references, the fit settings) and ``show``.

    The ``fit`` flags are added only when ``fit`` is used (a ``DeferredParser``), like every subcommand's."""
    sub = p.add_subparsers(dest="guard_command", required=True, metavar="ACTION", parser_class=DeferredParser)
    f = sub.add_parser("fit", help="fit the guard from preference pairs and write it into the bundle (nvrm_guard.safetensors, listed in its "
                       "manifest)", add_args=add_fit_args)
    f.set_defaults(run=run_fit)
    s = sub.add_parser("show", help="what the bundle's guard is, how it was fitted and what it measured")
    s.add_argument("--model", required=True, help="bundle directory")
    s.set_defaults(run=run_show)


def add_fit_args(f: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm guard fit``: the model's flags, the pairs, references and every ``GuardFitSettings`` field."""
    from ..guard.fit_settings import GuardFitSettings
    from .model_flags import add_model_args
    from .options import add_dataclass_args

    add_model_args(f)
    f.add_argument("--pairs", required=True, help="pairs.jsonl in the format nvrm train reads (prompt, context, chosen, rejected)")
    f.add_argument("--references", help="optional JSONL of more genuine candidates: prompt, context, video (paths relative to the file)")
    f.add_argument("--json", action="store_true", help="print the fit's summary as one JSON object")
    add_dataclass_args(f, GuardFitSettings, group="fit settings")


def run_fit(args: argparse.Namespace) -> int:
    """``nvrm guard fit``: :func:`nvrm.train.fit_guard`, then :func:`nvrm.guard.write_bundle_guard`. Returns 0."""
    from ..guard import GuardFitSettings, write_bundle_guard
    from ..train import fit_guard, read_references
    from .model_flags import load_model
    from .options import dataclass_from_args

    say = (lambda m: None) if args.json else (lambda m: print(f"nvrm guard: {m}", file=sys.stderr))
    model = load_model(args)
    refs = read_references(args.references) if args.references else ()
    guard = fit_guard(model, args.pairs, references=refs, settings=dataclass_from_args(args, GuardFitSettings), say=say)
    path = write_bundle_guard(model.path, guard)
    summary = {"guard": str(path), "floor": guard.floor, "threshold": guard.threshold, **guard.info}
    print(json.dumps(summary) if args.json else f"nvrm guard: wrote {path} ({json.dumps(guard.info.get('holdout', {}))})")
    return 0


def run_show(args: argparse.Namespace) -> int:
    """``nvrm guard show``: the guard's fingerprints, numbers and fit summary as JSON. Returns 0."""
    from pathlib import Path

    from ..errors import BundleError
    from ..guard import GUARD_FILE, load_guard

    path = Path(args.model) / GUARD_FILE
    if not path.is_file():
        raise BundleError(f"{args.model}: has no guard ({GUARD_FILE}); fit one with nvrm guard fit")
    g = load_guard(path)
    print(json.dumps({"guard": str(path), "model": g.model, "preprocessing": g.preprocessing, "floor": g.floor, "threshold": g.threshold,
                      "reference": g.reference, "info": g.info}, indent=2))
    return 0
