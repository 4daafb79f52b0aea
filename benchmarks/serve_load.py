"""Load benchmark for `nvrm serve`, side by side in one run.

    .venv/bin/python benchmarks/serve_load.py [--arch tiny|mid|4b] [--concurrency 1,8,32,64] [--requests 64] [--json out.json]
        [--transports json,binary] [--shared-only | --no-shared]

Workload (the issue's): one item per request, frames already at 1 fps and
360x640, a 10-frame context and a 5-frame candidate, as in-memory clips.

Measured, each against real `nvrm serve` processes on loopback:
- in-process `score_batch` on the same items (the baseline);
- the service over JSON (base64 .npy) and over binary (multipart .npy parts);
- cross-request batching on (defaults) vs off (--max-batch-items 1);
- shared contexts: 8 requests with one (new) context, all at once and staggered by 0.1 s,
  cache on vs prefix cache off (--prefix-cache-mb 0) vs cache off (--context-cache-mb 0);
- parsing cost: the server's nvrm_parse_seconds per request against the
  contract time of the same item measured in process;
- the network path (``--network``): bytes uploaded per candidate for a flow-GRPO
  group (8 candidates of 81 frames at 240x416, 16 fps) with the client's defaults
  (sampling before upload, contexts by hash) against whole uploads, with the
  rewards compared; 8 concurrent clients sharing one context against 8 with
  distinct contexts; and the context-store hit rate over those runs;
- cosmos-rl's path (``--cosmos``): ``--cosmos-groups`` prompts of 8 B = 1 latent rollouts each, enqueued at
  once and pulled until scored, against in-process decoding with the same Wan2.1 decoder (a group per
  call) plus ``score_group`` on the same frames, rewards compared bit for bit, with the decode's share (``--vae tiny`` builds a small random
  AutoencoderKLWan, ``--vae wan`` one of the real Wan2.1 shape; ``--latent-size`` the latent h x w).
Reports items/s, p50 and p99 latency per concurrency.
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
import numpy as np

from nvrm import Clip
from nvrm.bench.harness import build_bench_bundle, device_name
from nvrm.client import RewardClient

NVRM = [sys.executable, "-c", "import sys; from nvrm.cli.main import main; sys.exit(main())"]
PROMPT = "The camera walks forward along a busy street at dusk."


def frames(n: int, seed: int, h: int = 360, w: int = 640) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(h + n, w + n, 3), dtype=np.uint8)
    return np.stack([base[i : i + h, i : i + w] for i in range(n)])


def make_items(n: int) -> list[tuple[str, Clip, Clip]]:
    """n items over 8 contexts (10 frames, each used by every 8th item) and 8 candidates (5 frames), all at 1 fps."""
    ctxs = [frames(10, 1000 + i % 8) for i in range(8)]
    cands = [frames(5, 2000 + i % 8) for i in range(8)]
    return [(PROMPT, Clip(ctxs[i % 8], 1.0, name=f"ctx{i}"), Clip(cands[(i * 3) % 8], 1.0, name=f"cand{i}")) for i in range(n)]


class Server:
    def __init__(self, bundle: Path, *extra: str, log_dir: Path, env: dict | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / f"serve-{self.port}.log", "w")
        self.proc = subprocess.Popen([*NVRM, "serve", "--model", str(bundle), "--port", str(self.port), "--max-queue-items", "4096",
                                      "--max-body-mb", "512", *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(3000):
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                self.log.flush()
                raise SystemExit(f"server exited: see {self.log.name}: " + Path(self.log.name).read_text()[-2000:])
            time.sleep(0.1)
        raise SystemExit("server did not start")

    def metric(self, name: str) -> float:
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def drive(url: str, concurrency: int, items: list, transport: str) -> dict:
    """``len(items)`` one-item requests from ``concurrency`` client threads; throughput and latency."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    queue = list(enumerate(items))

    def worker() -> None:
        c = RewardClient(url, transport=transport, retries=20, backoff=0.05)  # type: ignore[arg-type]
        while True:
            with lock:
                if not queue:
                    break
                _, it = queue.pop()
            t = time.perf_counter()
            try:
                c.score_batch([it], errors="raise")
            except Exception as e:  # noqa: BLE001
                errors.append(str(e))
            with lock:
                lat.append(time.perf_counter() - t)
        c.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {
        "concurrency": concurrency,
        "items_per_s": len(items) / wall,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "errors": len(errors),
    }


STAGGER_S = 0.1
"""Gap between the starts of staggered shared-context requests."""


def shared_context(url: str, round_: int, n: int = 8, stagger_s: float = 0.0) -> float:
    """Seconds until n one-item requests that share one context are all answered.

    Each round has a context of its own (as each RL step does), so nothing carries over
    from an earlier round: only the sharing among the round's n requests is measured.
    With ``stagger_s`` request i starts i * stagger_s after the first (rollout workers that
    finish one after another); otherwise all start together."""
    return eight_clients(url, 10_000 + round_, True, n, stagger_s)


def group_bytes(server: "Server", n: int = 8) -> dict:
    """Bytes a client sends for one flow-GRPO group: whole clips vs the defaults; rewards must agree."""
    from nvrm.synth.clips import moving_square

    ctx = Clip(moving_square(40, 240, 416, seed=1), fps=8.0, name="context")
    cands = [Clip(moving_square(81, 240, 416, seed=10 + i, speed=1 + i % 3), fps=16.0, name=f"cand{i}") for i in range(n)]
    out = {}
    for label, kw in (("whole", {"presample": False, "context_refs": False}), ("first request", {}), ("later request", {})):
        c = RewardClient(server.url, **kw) if label != "later request" else out["_client"]
        before = server.metric('nvrm_request_bytes_total{endpoint="group"}') + server.metric('nvrm_request_bytes_total{endpoint="contexts"}')
        rewards = [r.reward for r in c.score_group(PROMPT, ctx, cands)]
        sent = server.metric('nvrm_request_bytes_total{endpoint="group"}') + server.metric('nvrm_request_bytes_total{endpoint="contexts"}') - before
        out[label] = {"bytes_per_candidate": sent / n, "rewards": rewards}
        out["_client"] = c
    out.pop("_client")
    whole = out["whole"]
    return {
        "workload": f"group of {n}: 81 frames 240x416 at 16 fps each, context 40 frames at 8 fps",
        "bytes_per_candidate": {k: v["bytes_per_candidate"] for k, v in out.items()},
        "reduction_first_request": whole["bytes_per_candidate"] / out["first request"]["bytes_per_candidate"],
        "reduction_later_request": whole["bytes_per_candidate"] / out["later request"]["bytes_per_candidate"],
        "rewards_equal": out["first request"]["rewards"] == whole["rewards"] == out["later request"]["rewards"],
    }


def eight_clients(url: str, round_: int, shared: bool, n: int = 8, stagger_s: float = 0.0, uploaded: bool = False) -> float:
    """Seconds until n concurrent clients (one request each) are answered: one shared context, or n distinct.
    With ``stagger_s`` client i starts i * stagger_s after the first; with ``uploaded`` the context was
    uploaded once before the clients start (a trainer that holds it), outside the timing."""
    ctxs = [Clip(frames(10, 20_000 + 100 * round_ + (0 if shared else i)), 1.0, name="ctx") for i in range(n)]
    if uploaded:
        RewardClient(url).upload_context(ctxs[0])
    cands = [Clip(frames(5, 300 + i), 1.0) for i in range(n)]
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        c = RewardClient(url)
        barrier.wait()
        time.sleep(i * stagger_s)
        c.score(PROMPT, ctxs[i], cands[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def network(bundle: Path, tmp: Path) -> dict:
    s = Server(bundle, log_dir=tmp)
    try:
        report = {"group_upload": group_bytes(s)}
        eight_clients(s.url, 0, True)  # warm-up

        def store() -> tuple[float, float, float]:
            return (s.metric('nvrm_context_store_total{result="hit"}'), s.metric('nvrm_context_store_total{result="miss"}'),
                    s.metric("nvrm_context_store_puts_total"))

        a = store()
        shared = [eight_clients(s.url, r, True) for r in range(1, 4)]
        b = store()
        staggered = [eight_clients(s.url, r, True, stagger_s=STAGGER_S) for r in range(4, 7)]
        c = store()
        uploaded = [eight_clients(s.url, r, True, uploaded=True) for r in range(10, 13)]
        d = store()
        distinct = [eight_clients(s.url, r, False) for r in range(7, 10)]
        report["eight_clients_s"] = {"shared context": min(shared), "distinct contexts": min(distinct), "runs": {"shared": shared, "distinct": distinct}}
        report["shared_vs_distinct_speedup"] = min(distinct) / min(shared)
        report["eight_clients_staggered_s"] = {"stagger_s": STAGGER_S, "shared context": min(staggered), "runs": staggered}
        report["eight_clients_uploaded_first_s"] = {"shared context": min(uploaded), "runs": uploaded}
        report["uploaded_first_vs_distinct_speedup"] = min(distinct) / min(uploaded)

        def rate(x, y):
            hits, misses, puts = (q - p for p, q in zip(x, y))
            return {"hits": hits, "misses": misses, "hit_rate": hits / max(hits + misses, 1), "contexts_sent_inline_or_uploaded": puts}

        # lookups are the presence checks of clients new to a context and the requests that name it by ref;
        # clients that all start at once cannot know of each other, so each sends the context once
        report["context_store"] = {
            "shared, all at once (3 rounds)": rate(a, b),
            f"shared, staggered {STAGGER_S} s (3 rounds)": rate(b, c),
            "shared, uploaded first (3 rounds)": rate(c, d),
        }
        return report
    finally:
        s.stop()


def random_vae(kind: str, folder: Path) -> Path:
    """A random-weight AutoencoderKLWan in ``folder``: ``tiny`` (base_dim 8) or ``wan`` (the Wan2.1 shape)."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[False, True, True]) if kind == "tiny" else AutoencoderKLWan()
    vae.save_pretrained(str(folder))
    return folder


def cosmos_group(url: str, bodies: list[bytes], poll_s: float = 0.1) -> tuple[float, float, list[float]]:
    """(seconds from the first enqueue to the last pull, decode seconds, the rewards in body order) of B = 1 rollouts
    all enqueued at once (one thread each, as cosmos-rl's rollout workers send them)."""
    group = len(bodies)
    answers: list[dict] = [{}] * group

    def one(i: int) -> None:
        with httpx.Client(timeout=600) as c:
            uuid = c.post(url + "/api/reward/enqueue", content=bodies[i], headers={"content-type": "application/octet-stream"}).json()["uuid"]
            while True:
                a = c.post(url + "/api/reward/pull", data={"uuid": uuid, "type": "nvrm"})
                if a.status_code != 425:
                    answers[i] = a.json()
                    return
                time.sleep(poll_s)  # 0.1 s by default: faster polling would load this 2-core machine itself

    t = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(group)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.perf_counter() - t
    assert all(not a.get("errors") for a in answers), answers
    # each answer carries its VAE call's seconds, and the rollouts of one call share them: summed once per call
    decoded = sum(float(d) for d in {a.get("decoded_duration") for a in answers} - {None, "N/A"})
    return took, decoded, [a["scores"]["reward"][0] for a in answers]


def cosmos_latency(bundle: Path, tmp: Path, vae_kind: str, latent_hw: tuple[int, int], group: int = 8, rounds: int = 3,
                   against: str | None = None, groups: int = 2, poll_s: float = 0.1) -> dict:
    """Enqueue -> pull for ``groups`` prompts of ``group`` B = 1 latent rollouts each, all enqueued at once, against the
    in-process path: for each prompt, its group's latents decoded in one ``LatentDecoder.decode`` call, then
    ``score_group`` on those frames. The service's rewards must equal the in-process ones bit for bit (checked every
    round). With ``against`` (a source folder, e.g. an earlier commit's ``src``) a second server runs nvrm from there,
    measured in the same rounds; the arms' order rotates round by round."""
    import io

    from nvrm import RewardModel
    from nvrm.serve.protocols.cosmos.latents import LatentDecoder

    vae = random_vae(vae_kind, tmp / f"vae-{vae_kind}")
    h, w = latent_hw
    rng = np.random.default_rng(0)
    prompts = [f"{PROMPT} (prompt {g})" for g in range(groups)]

    def latents(round_: int) -> list[np.ndarray]:
        """One group's [group, 16, 21, h, w] per prompt."""
        out = []
        for _ in range(groups):
            z = rng.standard_normal((group, 16, 21, h, w)).astype(np.float16)  # 81 frames: 1 conditioning + 5 s at 16 fps
            z[:, :, 0] = z[0, :, 0]  # one conditioning frame: the same decoded context for the group
            out.append(z)
        return out

    def body(prompt: str, z: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, z)
        meta = {"prompts": [prompt], "reward_fn": {"nvrm": 1.0}, "video_infos": [{"video_fps": 16.0}], "media_type": "latent"}
        return json.dumps(meta).encode() + b"\n" + buf.getvalue()

    model = RewardModel.from_pretrained(bundle)
    decoder = LatentDecoder(vae, model.device)

    def in_process(zs: list[np.ndarray]) -> tuple[float, float, list[float]]:
        t, dec, rewards = time.perf_counter(), 0.0, []
        for prompt, z in zip(prompts, zs):
            frames_, d = decoder.decode(z)
            dec += d
            rewards += [r.reward for r in model.score_group(prompt, Clip(frames_[0][:1], 16.0), [Clip(f[1:], 16.0) for f in frames_])]
        return time.perf_counter() - t, dec, rewards

    arms = {"in_process": None, "service": None, **({} if against is None else {"service_against": against})}
    servers = {k: Server(bundle, "--latent-decoder", str(vae), log_dir=tmp, env=None if src is None else {**os.environ, "PYTHONPATH": src})
               for k, src in arms.items() if k != "in_process"}
    times: dict[str, list[float]] = {k: [] for k in arms}
    decode_s: dict[str, list[float]] = {k: [] for k in arms}
    equal: dict[str, list[bool]] = {k: [] for k in arms if k != "in_process"}
    try:
        for r in range(rounds + 1):  # every arm in every round, the order rotating: the machine's load drifts
            zs = latents(r)
            bodies = [body(p, z[i : i + 1]) for p, z in zip(prompts, zs) for i in range(group)]
            names = list(arms)
            rewards = {}
            for k in names[r % len(names):] + names[: r % len(names)]:
                took, dec, rewards[k] = in_process(zs) if k == "in_process" else cosmos_group(servers[k].url, bodies, poll_s)
                if r:  # the first round warms up
                    times[k].append(took)
                    decode_s[k].append(dec)
            for k in equal:
                equal[k].append(rewards[k] == rewards["in_process"])
    finally:
        for s in servers.values():
            s.stop()
        model.close()
    in_process_s = min(times["in_process"])
    ratios = [a / b for a, b in zip(times["in_process"], times["service"])]  # round by round, the same load on both
    out = {
        "workload": f"{groups} prompts x {group} B=1 rollouts: latents [1, 16, 21, {h}, {w}] (81 frames), {vae_kind} Wan2.1 VAE",
        "enqueue_to_last_pull_s": min(times["service"]), "in_process_decode_plus_score_group_s": in_process_s,
        "service_vs_in_process": in_process_s / min(times["service"]),
        "service_vs_in_process_by_round": ratios,
        "rewards_equal_in_process_by_round": equal,
        "decode_share_service": min(decode_s["service"]) / min(times["service"]),
        "decode_share_in_process": min(decode_s["in_process"]) / in_process_s,
        "runs": times,
        "decode_s": decode_s,
    }
    if against is not None:
        out["against"] = against
        out["against_enqueue_to_last_pull_s"] = min(times["service_against"])
        out["against_vs_in_process"] = in_process_s / min(times["service_against"])
        out["against_vs_in_process_by_round"] = [a / b for a, b in zip(times["in_process"], times["service_against"])]
        out["decode_share_against"] = min(decode_s["service_against"]) / min(times["service_against"])
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="mid", choices=["tiny", "deep", "mid", "4b"])
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--requests", type=int, default=64, help="one-item requests per measurement")
    p.add_argument("--json", metavar="PATH", help="also write the report here")
    p.add_argument("--shared-only", action="store_true", help="only the shared-context comparison")
    p.add_argument("--no-shared", action="store_true", help="skip the shared-context comparison (three more server starts)")
    p.add_argument("--transports", default="json,binary", help="comma-separated: json, binary")
    p.add_argument("--network", action="store_true", help="also the network path: upload bytes, shared vs distinct contexts, store hit rate")
    p.add_argument("--network-only", action="store_true", help="only the network path")
    p.add_argument("--cosmos", action="store_true", help="also cosmos-rl's enqueue -> pull latency for a group of 8 latent rollouts")
    p.add_argument("--cosmos-rounds", type=int, default=3, help="timed rounds of --cosmos, each side (after one warm-up round)")
    p.add_argument("--cosmos-groups", type=int, default=2, help="prompts of --cosmos, each a group of 8 rollouts, all enqueued at once")
    p.add_argument("--cosmos-only", action="store_true", help="only cosmos-rl's path")
    p.add_argument("--cosmos-poll-s", type=float, default=0.1, help="seconds between a --cosmos client's pulls (each rollout's thread polls)")
    p.add_argument("--cosmos-against", metavar="SRC", help="also a --cosmos server running nvrm from SRC (PYTHONPATH), in the same rounds")
    p.add_argument("--vae", choices=["tiny", "wan"], default="tiny", help="random Wan2.1 VAE of --cosmos: small, or the real shape (GPU)")
    p.add_argument("--latent-size", default="8x12", help="latent h x w of --cosmos (60x104 is 480x832 video)")
    args = p.parse_args()
    transports = [t.strip() for t in args.transports.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    bundle = build_bench_bundle(args.arch)
    items = make_items(args.requests)

    from nvrm import RewardModel
    from nvrm.video.inputs import prepare_input

    model = RewardModel.from_pretrained(bundle)
    model.score_batch(items[:2])  # warm-up
    t = time.perf_counter()
    model.score_batch(items)
    inproc = len(items) / (time.perf_counter() - t)
    by_context: dict[int, list] = {}
    for it in items:  # the fairer baseline: the items that share a context as groups, as the service shares them
        by_context.setdefault(id(it[1].frames), []).append(it)
    t = time.perf_counter()
    list(model.score_groups((PROMPT, g[0][1], [c for _, _, c in g]) for g in by_context.values()))
    inproc_grouped = len(items) / (time.perf_counter() - t)
    t = time.perf_counter()
    for _, ctx, cand in items[:8]:
        prepare_input(ctx, "context", model.contract), prepare_input(cand, "candidate", model.contract)
    contract_s = (time.perf_counter() - t) / 8
    device = device_name(model.device)
    model.close()
    del model  # the servers below load their own copy

    report: dict = {
        "arch": args.arch,
        "device": device,
        "python": platform.python_version(),
        "workload": "one item per request: 10 context + 5 candidate frames, 360x640 at 1 fps, in-memory",
        "in_process_score_batch_items_per_s": inproc,
        "in_process_score_groups_items_per_s": inproc_grouped,
        "contract_s_per_item": contract_s,
        "rows": [],
    }
    with tempfile.TemporaryDirectory(prefix="nvrm-serve-load-") as tmp:
        if args.cosmos or args.cosmos_only:
            hw = tuple(int(x) for x in args.latent_size.split("x"))
            report["cosmos"] = cosmos_latency(bundle, Path(tmp), args.vae, hw, rounds=args.cosmos_rounds,  # type: ignore[arg-type]
                                            against=args.cosmos_against, groups=args.cosmos_groups, poll_s=args.cosmos_poll_s)
            print(json.dumps(report["cosmos"], indent=1), flush=True)
        if args.cosmos_only:
            args.shared_only, args.no_shared = True, True
        if args.network or args.network_only:
            report["network"] = network(bundle, Path(tmp))
            print(json.dumps(report["network"], indent=1), flush=True)
        if args.network_only:
            args.shared_only, args.no_shared = True, True
        for label, extra in (() if args.shared_only else (("batching on", ()), ("batching off", ("--max-batch-items", "1")))):
            s = Server(bundle, *extra, log_dir=Path(tmp))
            try:
                drive(s.url, 2, items[:4], "binary")  # warm-up
                for transport in transports:
                    for c in levels:
                        names = ("nvrm_parse_seconds_sum", "nvrm_parse_seconds_count", "nvrm_context_hash_seconds_sum")
                        before = [s.metric(m) for m in names]
                        row = {"server": label, "transport": transport, **drive(s.url, c, items, transport)}
                        parse, n, hashing = (s.metric(m) - b for m, b in zip(names, before))
                        row["parse_ms_per_request"] = 1000 * parse / max(n, 1)
                        row["context_hash_ms_per_request"] = 1000 * hashing / max(n, 1)
                        row["vs_in_process"] = row["items_per_s"] / inproc
                        row["vs_in_process_grouped"] = row["items_per_s"] / inproc_grouped
                        report["rows"].append(row)
                        print(json.dumps(row), flush=True)
            finally:
                s.stop()
        shared: dict[str, float] = {}
        staggered: dict[str, float] = {}
        arms = (("cache on", ()), ("prefix cache off", ("--prefix-cache-mb", "0")), ("cache off", ("--context-cache-mb", "0")))
        for label, extra in () if args.no_shared else arms:
            s = Server(bundle, *extra, log_dir=Path(tmp))
            try:
                shared_context(s.url, 0)  # warm-up
                shared[label] = min(shared_context(s.url, r) for r in range(1, 4))
                staggered[label] = min(shared_context(s.url, r, stagger_s=STAGGER_S) for r in range(4, 7))
            finally:
                s.stop()
        if shared:
            report["shared_context_8_requests_s"] = shared
            report["shared_context_staggered_s"] = {"stagger_s": STAGGER_S, **staggered}
            report["staggered_speedup"] = staggered["cache off"] / staggered["cache on"]
            report["staggered_speedup_without_prefix_cache"] = staggered["cache off"] / staggered["prefix cache off"]
            report["shared_context_speedup"] = shared["cache off"] / shared["cache on"]
            report["shared_context_speedup_without_prefix_cache"] = shared["cache off"] / shared["prefix cache off"]
    binary = [r for r in report["rows"] if r["server"] == "batching on" and r["transport"] == "binary"]
    if binary:
        report["parse_fraction_of_contract"] = max(r["parse_ms_per_request"] for r in binary) / 1000 / contract_s
        report["context_hash_fraction_of_contract"] = max(r["context_hash_ms_per_request"] for r in binary) / 1000 / contract_s
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
