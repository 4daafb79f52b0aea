"""``nvrm guard``: fit a bundle's guard (how far to trust each reward) from preference pairs, or show the one it has."""

from __future__ import annotations

import argparse
import json
import sys

from .options import DeferredParser


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm guard``: ``fit`` (the model's flags, the pairs, references, the fit settings), ``member`` and ``show``.

    The ``fit`` flags are added only when ``fit`` is used (a ``DeferredParser``), like every subcommand's."""
    sub = p.add_subparsers(dest="guard_command", required=True, metavar="ACTION", parser_class=DeferredParser)
    f = sub.add_parser("fit", help="fit the guard from preference pairs and write it into the bundle (nvrm_guard.safetensors, listed in its "
                       "manifest)", add_args=add_fit_args)
    f.set_defaults(run=run_fit)
    m = sub.add_parser("member", help="add a member to the bundle (the guard's opt-in check: another model of the same architecture, trained on other "
                       "data or from another seed), calibrated on the pairs' candidates", add_args=add_member_args)
    m.set_defaults(run=run_member)
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


def add_member_args(m: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm guard member``: the model's flags, the member bundle, the pairs and a name."""
    from .model_flags import add_model_args

    add_model_args(m)
    m.add_argument("--member", required=True, help="the member's bundle folder (nvrm train's OUTPUT/bundle, from the same base)")
    m.add_argument("--pairs", required=True, help="pairs.jsonl whose candidates calibrate the member (genuine ones: the guard's own pairs)")
    m.add_argument("--name", help="its folder under nvrm_members/ (default member-N)")
    m.add_argument("--json", action="store_true", help="print the calibration as one JSON object")


def run_member(args: argparse.Namespace) -> int:
    """``nvrm guard member``: :func:`nvrm.train.add_member`. Returns 0."""
    import dataclasses

    from ..train import add_member
    from .model_flags import load_model

    say = (lambda m: None) if args.json else (lambda m: print(f"nvrm guard: {m}", file=sys.stderr))
    model = load_model(args)
    try:
        folder, cal = add_member(model, args.member, args.pairs, name=args.name, say=say)
    finally:
        model.close()
    print(json.dumps({"folder": str(folder), **dataclasses.asdict(cal)}) if args.json else f"nvrm guard: wrote {folder}")
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
    from ..guard.members import MEMBER_FILE, member_folders

    members = {f.name: json.loads((f / MEMBER_FILE).read_text(encoding="utf-8")) for f in member_folders(args.model)}
    print(json.dumps({"guard": str(path), "model": g.model, "preprocessing": g.preprocessing, "floor": g.floor, "threshold": g.threshold,
                      "reference": g.reference, "info": g.info, "members": members}, indent=2))
    return 0
