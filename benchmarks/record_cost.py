"""What ``nvrm serve --record`` costs a request, side by side in one run.

    .venv/bin/python benchmarks/record_cost.py [--requests 40] [--candidates 3] [--bundle DIR] [--json out.json]

Two ``nvrm serve`` processes on one bundle (default: a tiny random one built here), one with
``--record`` and one without, each sent the same ``score_group`` requests (a shared context, distinct
candidates, so every request writes new frames), alternating between them one at a time. Reports
each one's p50 / mean latency, their ratio, and how many rows the record holds at the end.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.record.reader import read_rows
from nvrm.synth.clips import moving_square


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bundle: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """``nvrm serve`` on a free loopback port, once ready: (its process, its URL)."""
    port = _port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "nvrm"), "serve", "--model", str(bundle), "--port", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("nvrm serve did not become ready")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print (and optionally write) the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--candidates", type=int, default=3)
    ap.add_argument("--bundle", help="bundle to serve (default: a tiny random one)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="nvrm-record-cost-"))
    if args.bundle:
        bundle = Path(args.bundle)
    else:
        from nvrm.synth.bundles import build_tiny_bundle

        bundle = build_tiny_bundle(work / "tiny")
    record = work / "record"
    servers = {"off": start(bundle), "on": start(bundle, "--record", str(record))}
    try:
        clients = {k: RewardClient(url) for k, (_, url) in servers.items()}
        ctx = Clip(moving_square(2, 64, 32, seed=1), fps=1)
        seconds: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.requests + 3):  # the first 3 warm both up and are not counted
            cands = [Clip(moving_square(5, 64, 32, seed=100 * i + j), fps=1) for j in range(args.candidates)]
            for k in (("off", "on") if i % 2 else ("on", "off")):
                t = time.perf_counter()
                clients[k].score_group("a square moving right", ctx, cands)
                if i >= 3:
                    seconds[k].append(time.perf_counter() - t)
        time.sleep(1.0)
        rows, _ = read_rows(record)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    figures = {k: {"p50_ms": 1000 * statistics.median(v), "mean_ms": 1000 * statistics.fmean(v)} for k, v in seconds.items()}
    figures["ratio_p50"] = figures["on"]["p50_ms"] / figures["off"]["p50_ms"]
    figures["ratio_mean"] = figures["on"]["mean_ms"] / figures["off"]["mean_ms"]
    figures["requests"] = args.requests
    figures["record_rows"] = len(rows)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
