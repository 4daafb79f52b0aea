"""How far score_group and score_batch drift from score, over CPU capabilities, threads and inputs.

    .venv/bin/python benchmarks/drift_sweep.py --cases 12 --out benchmarks/results/drift-<machine>.json

Builds the 36-text-layer test bundle (the release's depth, narrow widths), then runs one
subprocess per (ATEN_CPU_CAPABILITY, torch threads) this machine supports. Each scores the same
cases with ``score``, ``score_group``, ``score_batch`` and both with ``exact=True``, and reports the
drift in bf16 ulps of the larger magnitude. The maxima are what ``nvrm.fidelity.numerics`` states as
bounds (README "Fidelity"; BENCHMARKS.md "Drift sweep").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [(96, 128), (64, 80), (120, 90), (200, 48), (64, 80)]
LONG_CONTEXT = None


def cases(n: int):
    """The deep test's three cases first (tests/integration/test_deep.py), then more of the same shape."""
    from nvrm import Clip
    from nvrm.synth.clips import moving_square

    for k in range(n):
        ctx = Clip(moving_square(4 + 4 * (k % 6), 64 + 16 * (k % 5), 80 + 8 * (k // 5), seed=k), fps=4)
        cands = [Clip(moving_square(24, *sz, seed=10 + i + 7 * k, speed=1 + i), fps=4) for i, sz in enumerate(SIZES)]
        yield f"prompt {k}", ctx, cands


def worker(bundle: str, n: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from nvrm import RewardModel
    from nvrm.fidelity.numerics import machine_info, ulps

    from nvrm import Clip
    from nvrm.synth.clips import moving_square

    global LONG_CONTEXT
    LONG_CONTEXT = Clip(moving_square(40, 96, 128, seed=99), fps=4)
    m = RewardModel.from_pretrained(bundle, device="cpu")
    group_max = batch_max = 0.0
    exact_ok = True
    per_case = []
    for prompt, ctx, cands in cases(n):
        single = [m.score(prompt, ctx, c).reward for c in cands]
        group = [r.reward for r in m.score_group(prompt, ctx, cands)]
        g = max(ulps(s, x) for s, x in zip(single, group))
        exact_ok &= [r.reward for r in m.score_group(prompt, ctx, cands, exact=True)] == single
        # the batch adds an item of a longer context, so its rows have many lengths
        items = [(prompt, ctx, c) for c in cands] + [(f"a longer prompt {prompt}", LONG_CONTEXT, cands[0])]
        single.append(m.score(*items[-1]).reward)
        batch = [r.reward for r in m.score_batch(items)]
        b = max(ulps(s, x) for s, x in zip(single, batch))
        exact_ok &= [r.reward for r in m.score_batch(items, exact=True)] == single
        group_max, batch_max = max(group_max, g), max(batch_max, b)
        per_case.append({"group_ulps": g, "batch_ulps": b})
    m.close()
    return {"machine": machine_info(), "group_max_ulps": group_max, "batch_max_ulps": batch_max, "exact_bit_identical": exact_ok, "cases": per_case}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--capabilities", default=None, help="comma list; default: every one this CPU supports")
    ap.add_argument("--bundle", default=None, help="default: build the 36-layer test bundle in a temp dir")
    ap.add_argument("--out", default=None)
    ap.add_argument("--_worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        print(json.dumps(worker(args._worker[0], int(args._worker[1]), int(args._worker[2]))))
        return 0

    from nvrm.fidelity.numerics import machine_info, supported_capabilities

    caps = args.capabilities.split(",") if args.capabilities else supported_capabilities()
    tmp = tempfile.TemporaryDirectory()
    bundle = args.bundle
    if bundle is None:
        from nvrm.synth.bundles import ArchSpec, build_tiny_bundle

        bundle = str(build_tiny_bundle(Path(tmp.name) / "deep36", ArchSpec.from_name("deep"), revision="deep-36"))
    runs = []
    for cap in caps:
        for threads in [int(t) for t in args.threads.split(",")]:
            env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, __file__, "--_worker", bundle, str(args.cases), str(threads)],
                env=env, capture_output=True, text=True,
            )
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            res.update(capability=cap, threads=threads, seconds=round(time.perf_counter() - t0, 1))
            runs.append(res)
            if args.out:  # after every run, so an interrupted sweep keeps what it measured
                Path(args.out).write_text(json.dumps({"machine": machine_info(), "cases": args.cases, "partial": True, "runs": runs}, indent=1) + "\n")
            print(
                f"{cap:8s} threads={threads}  ran as {res['machine']['cpu_capability']:7s}  group max {res['group_max_ulps']:4.1f} ulps"
                f"  batch max {res['batch_max_ulps']:4.1f} ulps  exact identical: {res['exact_bit_identical']}  ({res['seconds']} s)",
                flush=True,
            )
    summary = {
        "machine": machine_info(),
        "cases": args.cases,
        "candidates_per_case": len(SIZES),
        "group_max_ulps": max(r["group_max_ulps"] for r in runs),
        "batch_max_ulps": max(r["batch_max_ulps"] for r in runs),
        "exact_bit_identical": all(r["exact_bit_identical"] for r in runs),
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
