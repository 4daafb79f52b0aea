"""``nvrm bench``: naive vs score_batch vs score_group in one run."""

from __future__ import annotations

import argparse


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", choices=["tiny", "mid", "4b"], default="mid", help="random bundle size (4b: the real architecture, GPU)")
    p.add_argument("--groups", type=_ints, default=(1, 4, 8, 16), help="comma-separated group sizes G")
    p.add_argument("--contexts", type=_ints, default=(5, 10, 20), help="comma-separated context lengths in seconds")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-naive", action="store_true", help="skip the naive reference path")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from ..bench import format_table, main_json, run_bench

    report = run_bench(args.arch, args.groups, args.contexts, device=args.device, naive=not args.no_naive)
    print(main_json(report) if args.json else format_table(report))
    return 0
