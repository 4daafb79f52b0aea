"""The plain service's own cost in CPU seconds, against in-process ``score_batch`` on the same items (issue 38 item 5).

    .venv/bin/python benchmarks/serve_cpu.py [--arch mid] [--items 16] [--concurrency 16] [--rounds 4] [--json out.json]

Each round scores ``--items`` distinct one-item requests (a context of 10 frames and a candidate of 5, 360x640 at 1 fps,
new in every round so no cache carries over) twice, in alternating order: in process (``RewardModel.score_batch`` on
all of them; CPU seconds of this process, every thread) and through one ``nvrm serve`` (``--concurrency`` client
threads, one request each; CPU seconds of the server process from ``/proc/PID/stat``, its threads and any worker
processes, and of this process's client threads apart). Ratios are per round, so both arms share the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import PROMPT, Server, frames  # noqa: E402

from nvrm import Clip  # noqa: E402
from nvrm.bench.harness import build_bench_bundle  # noqa: E402
from nvrm.client import RewardClient  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """utime + stime of ``pid`` and its live children (threads are counted in the process's own line), seconds."""
    total = 0.0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15 of the line)
    return total


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def items_of(round_: int, n: int) -> list[tuple[str, Clip, Clip]]:
    """``n`` distinct items: each its own context and its own candidate."""
    base = 10_000 * (round_ + 1)
    return [(PROMPT, Clip(frames(10, base + i), 1.0, name=f"ctx{i}"), Clip(frames(5, base + 5000 + i), 1.0, name=f"cand{i}"))
            for i in range(n)]


def drive(clients: list[RewardClient], items: list) -> tuple[float, list[float]]:
    """(wall seconds, rewards in item order) of one-item requests, one client thread each (clients kept across rounds,
    as a trainer keeps them: each reads the server's contract once, in the warm-up round)."""
    rewards: list[float] = [0.0] * len(items)
    todo = list(range(len(items)))
    lock = threading.Lock()

    def worker(c: RewardClient) -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            rewards[i] = c.score_batch([items[i]], errors="raise")[0].reward

    t = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, rewards


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="mid", choices=["tiny", "deep", "mid", "4b"])
    p.add_argument("--items", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4, help="timed rounds, after one warm-up round")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--server-args", default="", help="extra nvrm serve arguments (space-separated)")
    args = p.parse_args()
    bundle = build_bench_bundle(args.arch)

    from nvrm import RewardModel

    model = RewardModel.from_pretrained(bundle)
    rows = []
    with tempfile.TemporaryDirectory(prefix="nvrm-serve-cpu-") as tmp:
        # a long deadline: on a loaded machine a 504 would make the clients send the item again, and count its work twice
        server = Server(bundle, "--request-timeout-s", "3600", *args.server_args.split(), log_dir=Path(tmp))
        clients = [RewardClient(server.url, retries=20, backoff=0.05) for _ in range(args.concurrency)]
        try:
            for r in range(args.rounds + 1):
                items = items_of(r, args.items)
                row: dict = {"round": r, "load_average": os.getloadavg()[0]}
                for arm in (("in_process", "service") if r % 2 == 0 else ("service", "in_process")):
                    if arm == "in_process":
                        c0, t = own_cpu(), time.perf_counter()
                        got = [x.reward for x in model.score_batch(items)]
                        row["in_process_cpu_s"], row["in_process_wall_s"] = own_cpu() - c0, time.perf_counter() - t
                        row["in_process_rewards"] = got
                    else:
                        s0, c0 = tree_cpu(server.proc.pid), own_cpu()
                        wall, got = drive(clients, items)
                        time.sleep(0.2)  # the server's last answer is out; let its threads settle before reading its CPU
                        row["server_cpu_s"], row["client_cpu_s"] = tree_cpu(server.proc.pid) - s0, own_cpu() - c0
                        row["service_wall_s"], row["service_rewards"] = wall, got
                row["server_vs_in_process_cpu"] = row["server_cpu_s"] / row["in_process_cpu_s"]
                row["rewards_equal"] = row.pop("in_process_rewards") == row.pop("service_rewards")
                print(json.dumps(row), flush=True)
                if r:
                    rows.append(row)
        finally:
            for c in clients:
                c.close()
            server.stop()
    model.close()
    ratios = sorted(x["server_vs_in_process_cpu"] for x in rows)
    report = {"arch": args.arch, "items": args.items, "concurrency": args.concurrency, "rounds": rows,
              "server_vs_in_process_cpu_median": float(np.median(ratios)), "server_vs_in_process_cpu_range": [ratios[0], ratios[-1]],
              "server_cpu_s_per_item_median": float(np.median([x["server_cpu_s"] for x in rows])) / args.items,
              "in_process_cpu_s_per_item_median": float(np.median([x["in_process_cpu_s"] for x in rows])) / args.items,
              "rewards_equal": all(x["rewards_equal"] for x in rows)}
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
