"""Load benchmark for `nvrm serve`: throughput and latency vs concurrency, batching on vs off.

    .venv/bin/python bench/serve_load.py [--arch tiny|mid] [--requests 160] [--json]

Builds a random-weight bundle, starts two real `nvrm serve` processes on
loopback one after the other (cross-request batching on: the defaults;
off: --max-batch-items 1) and drives each with C concurrent clients
(threads, one item per request, in-memory frames) for C = 1, 4, 16, 32.
Reports items/s and p50/p99 latency; the on/off ratio is measured side by
side in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from nvrm import Clip
from nvrm.client import RewardClient
from nvrm.synth.bundles import MID_SPEC, ArchSpec, build_tiny_bundle
from nvrm.synth.clips import moving_square

NVRM = Path(sys.executable).parent / "nvrm"


def start(bundle: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(NVRM), "serve", "--model", str(bundle), "--port", str(port), "--max-queue", "4096", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit("server did not start")


def drive(url: str, concurrency: int, requests: int, ctx: Clip, cands: list[Clip]) -> dict:
    lat: list[float] = []
    lock = threading.Lock()
    per = max(1, requests // concurrency)

    def client(k: int) -> None:
        c = RewardClient(url, retries=10)
        for j in range(per):
            t = time.perf_counter()
            c.score([("p", ctx, cands[(k + j) % len(cands)])], errors="raise")
            with lock:
                lat.append(time.perf_counter() - t)
        c.close()

    c0 = RewardClient(url)
    c0.score([("p", ctx, cands[0])], errors="raise")  # warm up
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))]

    return {"concurrency": concurrency, "items": len(lat), "items_per_s": len(lat) / wall,
            "p50_ms": pct(0.5) * 1000, "p99_ms": pct(0.99) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["tiny", "mid"], default="tiny")
    ap.add_argument("--requests", type=int, default=160, help="requests per concurrency level")
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    ctx = Clip(moving_square(2, 64, 32, seed=1), fps=1)
    cands = [Clip(moving_square(5, 64, 32, seed=10 + i, speed=1 + i), fps=1) for i in range(4)]
    out = {"machine": f"{platform.processor() or platform.machine()} x{os.cpu_count()}", "arch": args.arch, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = build_tiny_bundle(Path(tmp) / "bundle", MID_SPEC if args.arch == "mid" else ArchSpec())
        for mode, extra in (("batching on", ()), ("batching off", ("--max-batch-items", "1"))):
            proc, url = start(bundle, *extra)
            try:
                out["runs"][mode] = [drive(url, c, args.requests, ctx, cands) for c in levels]
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"arch={args.arch} machine={out['machine']}; one item per request (2-frame context, 5-frame candidate, 64x32 source frames)")
    print("| concurrency | batching on items/s | p50 ms | p99 ms | batching off items/s | p50 ms | p99 ms | on/off |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for on, off in zip(out["runs"]["batching on"], out["runs"]["batching off"]):
        print(f"| {on['concurrency']} | {on['items_per_s']:.1f} | {on['p50_ms']:.0f} | {on['p99_ms']:.0f} | "
              f"{off['items_per_s']:.1f} | {off['p50_ms']:.0f} | {off['p99_ms']:.0f} | {on['items_per_s'] / off['items_per_s']:.2f}x |")


if __name__ == "__main__":
    main()
