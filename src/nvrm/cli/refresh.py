"""``nvrm refresh``: one refresh cycle (record -> pairs -> judge -> filter -> train -> gate -> export), resumable."""

from __future__ import annotations

import argparse
import json
import sys


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm refresh``: the record, the bundle, the cycle folder, the judges, and every field of
    ``RefreshConfig``, ``TrainConfig``, ``RunSettings`` and ``JudgeContract``."""
    from ..prefs.judge_contract import JudgeContract
    from ..prefs.judging import RunSettings
    from ..refresh.cycle import RefreshConfig
    from ..train.config import TrainConfig
    from .options import add_dataclass_args

    p.add_argument("--record", required=True, metavar="DIR", help="the rollout record (nvrm serve --record, record=DIR; docs/record.md)")
    p.add_argument("--from", dest="base", required=True, metavar="BUNDLE",
                   help="the current bundle: the LoRA is trained from it, the gate compares with it")
    p.add_argument("--cycle", required=True, metavar="DIR",
                   help="the cycle folder: each stage's output and fingerprint (run again to resume)")
    p.add_argument("--judge", action="append", required=True, metavar="SPEC", help="a judge, as nvrm prefs judge takes it (repeatable)")
    p.add_argument("--rubric", help="rubric template file (default: nvrm's own)")
    p.add_argument("--anchor-pairs", help="original preference pairs the candidate must not regress on (beyond --max-anchor-drop)")
    p.add_argument("--export", metavar="DIR", help="where the passed bundle goes (default: CYCLE/export/bundle)")
    p.add_argument("--device", help="torch device for training and the gate")
    p.add_argument("--json", action="store_true", help="print the gate's report as one JSON object")
    serve = p.add_argument_group("swap into a running nvrm serve (after a passed gate and export)")
    serve.add_argument("--serve", metavar="URL", help="a running nvrm serve (started with --admin-key-env and an --allow-dir holding the "
                       "export): swap the exported bundle in through PUT /v1/models/NAME")
    serve.add_argument("--serve-model", metavar="NAME", help="the served model to swap (default: the server's default model)")
    serve.add_argument("--admin-key-env", default="NVRM_ADMIN_KEY", metavar="VAR",
                       help="environment variable holding the server's admin key (default NVRM_ADMIN_KEY)")
    serve.add_argument("--serve-key-env", metavar="VAR", help="environment variable holding the server's scoring key (its --api-key-env), if it has one")
    add_dataclass_args(p, RefreshConfig, group="cycle")
    add_dataclass_args(p, TrainConfig, group="training settings")
    add_dataclass_args(p, RunSettings, group="judge requests")
    add_dataclass_args(p, JudgeContract, group="judge contract (what each judge is shown)")


def run(args: argparse.Namespace) -> int:
    """``nvrm refresh``: :func:`nvrm.refresh.run_cycle`. Returns 0 when the gate passed (and the bundle was exported),
    1 with one line otherwise."""
    from ..prefs.judge_contract import JudgeContract
    from ..prefs.judging import RunSettings
    from ..refresh.cycle import RefreshConfig, run_cycle
    from ..train.config import TrainConfig
    from .options import dataclass_from_args

    result = run_cycle(args.record, args.base, args.cycle, args.judge, config=dataclass_from_args(args, RefreshConfig),
                       train=dataclass_from_args(args, TrainConfig), judging=dataclass_from_args(args, RunSettings),
                       judge_contract=dataclass_from_args(args, JudgeContract), rubric=args.rubric, anchor_pairs=args.anchor_pairs,
                       export=args.export, device=args.device, serve=args.serve, serve_model=args.serve_model,
                       admin_key_env=args.admin_key_env, serve_key_env=args.serve_key_env)
    if args.json:
        print(json.dumps(result.report))
    held = result.report["checks"]["holdout"]
    figures = f"held-out agreement {held['current']['accuracy']} -> {held['candidate']['accuracy']} ({result.folder}/gate/gate.json)"
    if not result.passed:
        print(f"nvrm refresh: gate failed, nothing exported: {result.failure}; {figures}", file=sys.stderr)
        return 1
    swap = f"; serving it as {result.swap['model']} at {result.swap['url']} (revision {result.swap['revision']})" if result.swap else ""
    print(f"nvrm refresh: gate passed, exported {result.export}; {figures}{swap}")
    return 0
