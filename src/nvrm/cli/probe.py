"""``nvrm probe``: score candidates as they are and under a battery of perturbations; flag potential hacks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm probe``: model loading, one clip (or a manifest), the perturbations to run, and the report outputs."""
    from .model_flags import add_model_args

    add_model_args(p, required=False)  # `--list` needs no model
    p.add_argument("--prompt", help="text prompt (single-clip mode)")
    p.add_argument("--context", help="preceding video (single-clip mode)")
    p.add_argument("--candidate", action="append", default=[], help="candidate video (repeatable)")
    p.add_argument("--input", metavar="MANIFEST", help="manifest.jsonl (the batch format): probe every candidate of every row")
    p.add_argument("--perturbations", help="comma-separated subset (default: all; see `nvrm probe --list`)")
    p.add_argument("--list", action="store_true", help="list the perturbations and exit")
    p.add_argument("--seed", type=int, default=0, help="seed of the random perturbations")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report here")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _items(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    if args.input:
        from ..batch.manifest import ManifestRow, read_manifest

        rows = read_manifest(args.input)
        items = [(r.prompt, r.context, c) for r in rows if isinstance(r, ManifestRow) for c in r.candidates]
        if not items:
            raise InputError(args.input, "has no usable rows to probe")
        return items
    missing = [flag for flag, v in (("--prompt", args.prompt), ("--context", args.context), ("--candidate", args.candidate)) if not v]
    if missing:
        raise InputError("nvrm probe", f"needs {', '.join(missing)} (or --input MANIFEST)")
    return [(args.prompt, args.context, c) for c in args.candidate]


def run(args: argparse.Namespace) -> int:
    """Probe, print a table (or JSON), write the HTML report.

    Exit 1 when something is flagged, otherwise 2 when a clip or a perturbation could not be scored, else 0."""
    from ..probe import PERTURBATIONS, probe_many, summarize
    from .model_flags import load_model
    from .options import check_outputs

    if args.list:
        for p in PERTURBATIONS.values():
            print(f"{p.name:<13} {p.description}")
        return 0
    if not args.model:
        raise InputError("nvrm probe", "needs --model DIR (a bundle directory or Hub repo id)")
    check_outputs({"--context": args.context, "--candidate": args.candidate, "--input": args.input}, {"--html": args.html})
    items = _items(args)
    names = [n.strip() for n in args.perturbations.split(",")] if args.perturbations else None
    if names:
        unknown = [n for n in names if n not in PERTURBATIONS]
        if unknown:
            raise InputError(f"--perturbations {args.perturbations}", f"unknown: {', '.join(unknown)} (see --list)")
    if args.html and not Path(args.html).resolve().parent.is_dir():
        raise InputError(args.html, "folder for the HTML report does not exist")
    with load_model(args) as model:
        reports = probe_many(model, items, perturbations=names, seed=args.seed, keep_frames=bool(args.html))
        info = {"revision": model.revision, "contract": model.fingerprint}
    summary = summarize(reports) if len(items) > 1 else None
    if args.html:
        from ..report.probe_html import render_probe_report

        Path(args.html).write_text(render_probe_report(reports, summary, info), encoding="utf-8")
    flagged = sorted({n for r in reports if hasattr(r, "flagged") for n in r.flagged})
    failed = [r for r in reports if not hasattr(r, "outcomes")]
    if len(failed) == len(reports) == 1:
        raise InputError("nvrm probe", f"not probed: {failed[0]}")
    errors = len(failed) + sum(1 for r in reports if hasattr(r, "outcomes") for o in r.outcomes if o.error)
    if args.json:
        out = {
            "clips": [r.to_dict() if hasattr(r, "to_dict") else {"error": str(r)} for r in reports],
            "summary": summary,
            "flagged": flagged,
            "errors": errors,
            "model": info,
            "html": args.html,
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        for r in reports:
            if not hasattr(r, "outcomes"):
                print(f"nvrm probe: not probed: {r}", file=sys.stderr)
                continue
            doubt = f" (uncertainty {r.uncertainty:.4f}: the part of the reward the guard puts in doubt)" if r.uncertainty is not None else ""
            print(f"{r.candidate}: original reward {r.reward:+.4f}{doubt}")
            print(f"  {'perturbation':<13} {'reward':>9} {'delta':>9} {'P(pert>orig)':>12}")
            for o in r.outcomes:
                if o.error:
                    print(f"  {o.name:<13} error: {o.error}")
                else:
                    print(f"  {o.name:<13} {o.reward:>+9.4f} {o.delta:>+9.4f} {o.p_preferred:>12.3f}"
                          f"{'  <- FLAGGED: scores above the original' if o.flagged else ''}")
        if summary:
            print(f"{'perturbation':<13} {'raised':>7} {'mean delta':>11} {'std':>8}")
            for n, s in summary.items():
                raised = "-" if s["raised_fraction"] is None else f"{100 * s['raised_fraction']:.0f}%"
                mean = "-" if s["mean_delta"] is None else f"{s['mean_delta']:+.4f}"
                std = "-" if s["std_delta"] is None else f"{s['std_delta']:.4f}"
                print(f"{n:<13} {raised:>7} {mean:>11} {std:>8}")
        print("flagged: " + (", ".join(flagged) if flagged else "nothing") + (f" ({errors} clip(s) or perturbation(s) failed; see above)" if errors else ""))
        if args.html:
            print(f"report: {args.html}")
    # A gate must not pass on a partial probe: flagged -> 1, else anything that failed -> 2.
    return 1 if flagged else 2 if errors else 0
