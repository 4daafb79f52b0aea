"""Wall and CPU seconds of short ``nvrm`` commands, two source trees side by side (issue 55, item 8).

    .venv/bin/python benchmarks/cli_startup.py --tree before=/tmp/nvrm-before/src --tree after=src [--runs 10]

Each tree runs with ``PYTHONPATH=TREE`` and this interpreter (so the same torch and transformers); the runs of
the trees alternate, so a load that comes and goes on a shared machine falls on both. Printed per command and
tree: the median and the best wall seconds, and the median CPU seconds (user + system, the process alone).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {  # {src}: the tree's src folder
    "nvrm --help": ["-m", "nvrm", "--help"],
    "nvrm score --help": ["-m", "nvrm", "score", "--help"],
    "nvrm verify DEMO": ["-m", "nvrm", "verify", "{src}/nvrm/assets/demo-bundle"],
    "import nvrm.scoring.reward_model": ["-c", "import nvrm.scoring.reward_model"],
}


def once(src: str, args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``python ARGS`` with ``src`` first on the path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *(a.format(src=src) for a in args)], env={**os.environ, "PYTHONPATH": src}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=SRC", help="a source tree (its src folder), repeatable")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--only", action="append", choices=sorted(COMMANDS), help="these commands only (default: all)")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    print(f"{'command':36} {'tree':8} {'median wall':>12} {'best wall':>10} {'median CPU':>11}")
    for name in args.only or list(COMMANDS):
        times: dict[str, list[tuple[float, float]]] = {t: [] for t in trees}
        for _ in range(args.runs):
            for tree, src in trees.items():
                times[tree].append(once(src, COMMANDS[name]))
        for tree, got in times.items():
            walls, cpus = [w for w, _ in got], [c for _, c in got]
            print(f"{name:36} {tree:8} {statistics.median(walls):>11.2f}s {min(walls):>9.2f}s {statistics.median(cpus):>10.2f}s")


if __name__ == "__main__":
    main()
