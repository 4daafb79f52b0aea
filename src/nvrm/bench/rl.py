"""``nvrm bench --workload rl``: a world-model RL step, end to end.

In-memory frames (``Clip``s, the way a world model hands them over) at a
configurable resolution and frame rate: per group one ``context_s``-second
context and G 5-second candidates; ``groups`` such groups in a stream. For
each G it reports, side by side in one run:

- the stages of one group on the calling thread: the contract (sampling and
  the per-frame transform), encoding (patches, tokens, positions) and the
  model (on prepared inputs);
- the engine's CPU stage over the stream (its workers, in parallel) and the
  model's stage over the stream;
- candidates/s end to end for a per-candidate ``score`` loop, ``score_batch``,
  a loop of ``score_group`` and the ``score_groups`` stream;
- the model's TFLOP/s (matmul FLOPs counted from the config, see
  ``forward_flops``) and, on CUDA, its share of the device's bf16 peak;
- overlap efficiency = stream time / max(CPU stage, model stage): 1.0 means
  the CPU work hides completely behind the model (or the reverse).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..engine.tasks import encode_video
from ..video.inputs import Clip, prepare_input
from .harness import build_bench_bundle, device_name, forward_flops, peak_tflops, timed

CANDIDATE_SECONDS = 5


def make_frames(n: int, height: int, width: int, seed: int) -> np.ndarray:
    """uint8 (n, H, W, 3) frames that change over time (a texture scrolling diagonally); fast to build."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(height + n, width + n, 3), dtype=np.uint8)
    return np.stack([base[i : i + height, i : i + width] for i in range(n)])


def make_groups(n_groups: int, g: int, context_s: float, fps: float, size: tuple[int, int]) -> list[tuple[str, Clip, list[Clip]]]:
    """The stream: every group has its own context Clip and G candidate Clips (frames shared to save memory)."""
    h, w = size
    ctx_frames = make_frames(int(round(context_s * fps)), h, w, seed=1)
    cand_frames = [make_frames(int(round(CANDIDATE_SECONDS * fps)), h, w, seed=100 + i) for i in range(min(g, 8))]
    prompt = "The camera walks forward along a busy street at dusk."
    return [
        (prompt, Clip(ctx_frames, fps, name=f"context {k}"), [Clip(cand_frames[i % len(cand_frames)], fps, name=f"candidate {k}.{i}") for i in range(g)])
        for k in range(n_groups)
    ]


def _stages(model, group: tuple[str, Clip, list[Clip]]) -> dict[str, float]:
    """Serial seconds of the contract, the encoding and the model for one group (calling thread)."""
    prompt, ctx, cands = group
    t0 = time.perf_counter()
    videos = [prepare_input(ctx, "context", model.contract)] + [prepare_input(c, "candidate", model.contract) for c in cands]
    t1 = time.perf_counter()
    state = model.engine._workers.local_state()
    encoded = [encode_video(state, v) for v in videos]
    enc = model.engine.encode_group(prompt, encoded[0], encoded[1:])
    t2 = time.perf_counter()
    prepared = model.engine.prepare_group(prompt, encoded[0], encoded[1:])
    _, t_model = timed(lambda: model.score_prepared_group(prepared), model.device)
    return {"contract_s": t1 - t0, "encode_s": t2 - t1, "model_s": t_model, "tokens": sum(len(s) for s in enc.ids)}


def group_flops(model, prepared) -> float:
    """The model FLOPs of one prepared group's forward (the shared prefix once, then each candidate's suffix)."""
    enc = prepared.encoded
    P = enc.prefix_len
    rows = [(P, 0)] + [(len(s) - P, P) for s in enc.ids]
    grids = [tuple(g) for g in enc.context_grid.tolist()] + [tuple(g) for c in enc.candidate_grids for g in c.tolist()]
    return forward_flops(model.backbone.config, rows, grids)


def run_rl(
    arch: str = "mid",
    groups_sizes: tuple[int, ...] = (8, 16),
    n_groups: int = 8,
    context_s: float = 10.0,
    fps: float = 8.0,
    size: tuple[int, int] = (480, 832),
    device: str | None = None,
    workers: int | None = None,
    worker_kind: str = "auto",
    loop_candidates: int = 8,
    measure_peak: bool = False,
) -> dict[str, Any]:
    """The RL workload report (see the module docstring); ``loop_candidates`` bounds the per-candidate loop."""
    from ..scoring.reward_model import RewardModel

    bundle = build_bench_bundle(arch)
    model = RewardModel.from_pretrained(bundle, device=device, workers=workers, worker_kind=worker_kind)
    dev = model.device
    peak = peak_tflops(dev, measure_peak)
    try:
        warm = make_groups(1, 2, context_s, fps, size)[0]
        model.score_group(*warm)  # allocator, kernels, worker start-up
        rows = [_rl_row(model, make_groups(n_groups, g, context_s, fps, size), g, loop_candidates, peak) for g in groups_sizes]
    finally:
        model.close()
    return {
        "workload": "rl",
        "arch": arch,
        "device": str(dev),
        "device_name": device_name(dev),
        "torch_threads": torch.get_num_threads(),
        "workers": {"count": model.engine.workers, "kind": model.engine.kind},
        "max_batch_tokens": model.max_batch_tokens,
        "frames": {"height": size[0], "width": size[1], "fps": fps, "context_s": context_s, "candidate_s": CANDIDATE_SECONDS},
        "peak_tflops": peak,
        "rows": rows,
    }


def _rl_row(model, stream: list, g: int, loop_candidates: int, peak: float | None) -> dict[str, Any]:
    """One group size: the stages, then each path over the same stream, side by side."""
    dev, n_groups = model.device, len(stream)
    prompt, ctx, cands = stream[0]
    stages = _stages(model, stream[0])

    # the CPU stage over the stream: the engine alone, with its workers
    def prepare_all():
        jobs = [model.engine.submit_group(p, c, cs) for p, c, cs in stream]
        return [j.result() for j in jobs]

    prepared, t_cpu = timed(prepare_all, dev)
    # the model stage over the stream: prepared inputs only
    _, t_gpu = timed(lambda: [model.score_prepared_group(p) for p in prepared], dev)
    flops = group_flops(model, prepared[0])
    prepared = None  # free the stream before the paths run

    k = min(loop_candidates, g)
    loop, t_loop = timed(lambda: [model.score(prompt, ctx, c) for c in cands[:k]], dev)
    batch, t_batch = timed(lambda: model.score_batch([(prompt, ctx, c) for c in cands]), dev)
    groups, t_group = timed(lambda: [model.score_group(p, c, cs) for p, c, cs in stream], dev)
    streamed, t_stream = timed(lambda: list(model.score_groups(stream, errors="raise")), dev)

    rewards_group = [r.reward for r in groups[0]]
    total = n_groups * g
    model_tflops = flops * n_groups / t_gpu / 1e12
    return {
        "G": g,
        "groups": n_groups,
        "tokens_per_group": stages["tokens"],
        "stages_one_group_s": {k2: stages[k2] for k2 in ("contract_s", "encode_s", "model_s")},
        "cpu_stage_s": t_cpu,
        "model_stage_s": t_gpu,
        "candidates_per_s": {"score_loop": k / t_loop, "score_batch": g / t_batch, "score_group": total / t_group, "score_groups": total / t_stream},
        "score_groups_vs_score_group": t_group / t_stream,
        "overlap_efficiency": t_stream / max(t_cpu, t_gpu),
        "model_tflops": model_tflops,
        "model_peak_fraction": model_tflops / peak if peak else None,
        "max_abs_diff": {
            "group_vs_score": max(abs(a.reward - b) for a, b in zip(loop, rewards_group[:k])),
            "batch_vs_score": max(abs(a.reward - b.reward) for a, b in zip(loop, batch[:k])),
            "stream_vs_group": max(abs(a.reward - b.reward) for x, y in zip(groups, streamed) for a, b in zip(x, y)),
        },
    }


def format_rl(report: dict[str, Any]) -> str:
    f = report["frames"]
    lines = [
        f"rl workload: arch={report['arch']} device={report['device']} ({report['device_name']}), "
        f"workers={report['workers']['count']} ({report['workers']['kind']}), torch threads={report['torch_threads']}",
        f"frames {f['width']}x{f['height']} @ {f['fps']:g} fps in memory, {f['context_s']:g} s context, {f['candidate_s']} s candidates; "
        f"max_batch_tokens={report['max_batch_tokens']}" + (f"; peak {report['peak_tflops']:.0f} TFLOP/s" if report["peak_tflops"] else ""),
        "| G | contract / encode / model, one group (s) | CPU stage / model stage, stream (s) | loop | batch | group | groups "
        "| groups vs group | overlap | model TFLOP/s | max |Δr| group vs score |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        s, c = r["stages_one_group_s"], r["candidates_per_s"]
        frac = f" ({100 * r['model_peak_fraction']:.0f}%)" if r["model_peak_fraction"] else ""
        lines.append(
            f"| {r['G']} | {s['contract_s']:.3f} / {s['encode_s']:.3f} / {s['model_s']:.3f} | {r['cpu_stage_s']:.2f} / {r['model_stage_s']:.2f} "
            f"| {c['score_loop']:.2f} | {c['score_batch']:.2f} | {c['score_group']:.2f} | {c['score_groups']:.2f} "
            f"| {r['score_groups_vs_score_group']:.2f}x | {r['overlap_efficiency']:.2f} | {r['model_tflops']:.3g}{frac} "
            f"| {r['max_abs_diff']['group_vs_score']:.3g} |"
        )
    lines.append("candidates/s columns: loop = per-candidate score(), batch = score_batch, group = loop of score_group, groups = score_groups stream")
    return "\n".join(lines)
