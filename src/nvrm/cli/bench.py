"""``nvrm bench --workload files|rl|engine|vision|grad|train|train-step|backend-parity``: paths side by side in one run."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTH such as 480x832, got {text!r}") from e
    return h, w


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``nvrm bench``: the workload, the random bundle size and the workload's own knobs."""
    p.add_argument("--workload", choices=["files", "rl", "engine", "vision", "grad", "train", "train-step", "backend-parity", "hacking"],
                   default="files", help="what to measure (default files)")
    p.add_argument("--arch", choices=["tiny", "deep", "mid", "4b"], default="mid", help="random bundle size (4b: the real architecture, GPU)")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--output", metavar="PATH", help="also write the JSON report here")
    files = p.add_argument_group("files workload")
    files.add_argument("--groups", type=_ints, default=(1, 4, 8, 16), help="comma-separated group sizes G")
    files.add_argument("--contexts", type=_ints, default=(5, 10, 20), help="comma-separated context lengths in seconds")
    files.add_argument("--no-naive", action="store_true", help="skip the naive reference path")
    rl = p.add_argument_group("rl, engine, vision and grad workloads")
    rl.add_argument("--G", dest="group_sizes", type=_ints, default=(8, 16), help="comma-separated group sizes (rl)")
    rl.add_argument("--n-groups", type=int, default=8, help="groups in the stream (rl)")
    rl.add_argument("--context-s", type=float, default=10.0, help="context seconds (rl)")
    rl.add_argument("--fps", type=float, default=8.0, help="frame rate of the in-memory frames (rl, engine)")
    rl.add_argument("--size", type=_size, default=(480, 832), help="HEIGHTxWIDTH of the frames (rl, engine)")
    rl.add_argument("--workers", type=int, default=None, help="preprocessing workers (rl)")
    rl.add_argument("--worker-kind", choices=["auto", "thread", "process"], default="auto", help="(rl)")
    rl.add_argument("--engine-configs", default="thread:1,thread:2,process:1,process:2", help="kind:workers list (engine)")
    rl.add_argument("--frames", type=int, default=80, help="equal-size frames (vision); frames per candidate (grad, default 81)")
    rl.add_argument("--torch-threads", type=int, default=None, help="intra-op threads of the model (default: torch's)")
    rl.add_argument("--measure-peak", action="store_true", help="measure the device's bf16 matmul peak instead of the known figure")
    bp = p.add_argument_group("backend-parity workload (also --G, --n-groups, --context-s, --fps, --size)")
    bp.add_argument("--vllm-url", default=None, help="a vLLM server serving the bench bundle's export, instead of vLLM in this process")
    bp.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes compared, each on its own engine")
    hk = p.add_argument_group("hacking workload (a bundle with a guard; default: the embedded demo bundle)")
    hk.add_argument("--model", help="bundle with a guard (default: the embedded demo bundle)")
    hk.add_argument("--hack-examples", type=int, default=12, help="held-out synthetic examples for detection (0: skip)")
    hk.add_argument("--hack-seed", type=int, default=3_000_000, help="first held-out example seed")
    hk.add_argument("--over-steps", type=int, default=40, help="optimisation steps of the over-optimisation runs (0: skip)")
    hk.add_argument("--over-seeds", type=_ints, default=(4_000_000, 4_000_001, 4_000_002), help="start examples of the over-optimisation runs")
    hk.add_argument("--cost-repeats", type=int, default=10, help="alternated score_group calls with and without the guard (0: skip)")
    hk.add_argument("--plots", metavar="DIR", help="write the figures (PNG) here")
    hk.add_argument("--members", action="store_true", help="load the bundle's members too (the guard's opt-in check, nvrm guard member): "
                    "detection, over-optimisation and cost then include them")
    hk.add_argument("--member-rate", type=float, default=0.0, metavar="R", help="load the bundle's members to run on a share R of the "
                    "calls for a monitor alone (LoadSettings.member_rate): only the cost is measured, as means")
    hk.add_argument("--squeeze", action="store_true", help="detection: also score every candidate JPEG-squeezed (the opt-in second "
                    "forward) and report what min(conservative, squeezed reward) adds")
    hk.add_argument("--cost-arch", choices=["tiny", "deep", "mid", "4b"], help="measure only the guard's cost, on a random bundle of this "
                    "size with a stand-in guard (its computation is the real guard's at that size), frames at --size, groups of --G's first")
    tr = p.add_argument_group("train and train-step workloads")
    tr.add_argument("--examples", type=int, default=8, help="synthetic examples of the small pairs file, 2 pairs each (train)")
    tr.add_argument("--factor", type=int, default=10, help="how many times larger the large pairs file is (train)")
    tr.add_argument("--batch-pairs", type=int, default=4, help="pairs per optimizer step (train, train-step)")
    tr.add_argument("--steps", type=int, default=3, help="optimizer steps timed (train-step)")


def _configs(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for part in text.split(","):
        kind, _, n = part.partition(":")
        if kind not in ("thread", "process") or not n.isdigit() or int(n) < 1:
            raise InputError(f"--engine-configs {text}", f"{part!r} is not kind:workers with kind thread or process")
        out.append((kind, int(n)))
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark workload, print its table (or JSON with ``--json``) and return 0."""
    from .. import bench

    if args.n_groups < 1:
        raise InputError(f"--n-groups {args.n_groups}", "must be at least 1")
    if args.torch_threads is not None:
        import torch

        if args.torch_threads < 1:
            raise InputError(f"--torch-threads {args.torch_threads}", "must be at least 1")
        torch.set_num_threads(args.torch_threads)
    if args.workload == "files":
        report = bench.run_bench(args.arch, args.groups, args.contexts, device=args.device, naive=not args.no_naive)
        text = bench.format_table(report)
    elif args.workload == "rl":
        report = bench.run_rl(
            args.arch, args.group_sizes, args.n_groups, args.context_s, args.fps, args.size,
            device=args.device, workers=args.workers, worker_kind=args.worker_kind, measure_peak=args.measure_peak,
        )
        text = bench.format_rl(report)
    elif args.workload == "engine":
        report = bench.run_engine(args.arch, _configs(args.engine_configs), fps=args.fps, size=args.size)
        text = bench.format_engine(report)
    elif args.workload == "grad":
        G = args.group_sizes[0] if args.group_sizes != (8, 16) else 4
        frames = 81 if args.frames == 80 else args.frames
        fps = 16.0 if args.fps == 8.0 else args.fps
        size = (240, 416) if args.size == (480, 832) else args.size
        report = bench.run_grad(args.arch, G=G, frames=frames, fps=fps, size=size, device=args.device)
        text = bench.format_grad(report)
    elif args.workload == "train":
        report = bench.run_train_bench(args.arch, examples=args.examples, factor=args.factor, batch_pairs=args.batch_pairs)
        text = bench.format_train(report)
    elif args.workload == "train-step":
        size = (432, 768) if args.size == (480, 832) else args.size
        report = bench.run_train_step(args.arch, batch_pairs=args.batch_pairs, steps=args.steps, device=args.device, size=size)
        text = bench.format_train_step(report)
    elif args.workload == "backend-parity":
        dtypes = tuple(d for d in args.dtypes.split(",") if d)
        if not dtypes or set(dtypes) - {"float32", "bfloat16", "float16"}:
            raise InputError(f"--dtypes {args.dtypes}", "must name float32, bfloat16 or float16, comma-separated")
        size = (64, 96) if args.size == (480, 832) else args.size
        report = bench.run_backend_parity(args.arch, args.group_sizes if args.group_sizes != (8, 16) else (8,),
                                          args.n_groups if args.n_groups != 8 else 4, args.context_s if args.context_s != 10.0 else 2.0,
                                          args.fps, size, device=args.device, vllm_url=args.vllm_url, dtypes=dtypes,
                                          measure_peak=args.measure_peak)
        text = bench.format_backend_parity(report)
    elif args.workload == "hacking":
        import sys

        from .demo import ensure_demo_bundle
        from ..bench import hacking

        if args.cost_arch:
            report = hacking.run_guard_cost_on_arch(args.cost_arch, args.group_sizes[0], args.cost_repeats or 10, args.size, args.device)
        else:
            report = hacking.run_hacking(args.model or str(ensure_demo_bundle()), examples=args.hack_examples, seed=args.hack_seed,
                                         over_seeds=args.over_seeds, over_steps=args.over_steps, cost_repeats=args.cost_repeats,
                                         say=lambda m: print(f"nvrm bench: {m}", file=sys.stderr), squeezed=args.squeeze,
                                         members=args.members, member_rate=args.member_rate)
        if args.plots:
            report["plots"] = hacking.plot_hacking(report, args.plots)
        text = hacking.format_hacking(report)
    else:
        report = bench.run_vision(args.arch, frames=args.frames, device=args.device)
        text = bench.format_vision(report)
    blob = bench.clean_json(report)
    if args.output:
        Path(args.output).write_text(blob + "\n")
    print(blob if args.json else text)
    return 0
