"""``nvrm bench --workload backend-parity``: the vLLM backend against nvrm's exact path, on the same items, side by side.

For each dtype (float32, then bfloat16) and each group size G, the same stream of groups (in-memory frames) is
scored by nvrm's exact path, by nvrm's fast group path (shared prefix; the speed to beat) and by
``backend="vllm"`` (vLLM in this process, or the server at ``--vllm-url``), each timed over the whole stream
(candidates/s, and the model's share of the device's bf16 peak where it is known), and compared:

- float32: the max abs difference (the tests hold it to 1e-5);
- bfloat16: max abs and relative difference, and in every group Kendall's tau and the share of candidate pairs
  both order the same way (a tie in either counts as not the same);
- prefix caching on vs off (every request its own cache salt): bit-identical or not, and the prompt tokens vLLM
  read from its cache.

vLLM must be importable here (``pip install 'nvrm[vllm]'``) unless ``--vllm-url`` is given; on CPU the bundle's head
size must be one vLLM's CPU attention has (the ``mid`` bench bundle has head_dim 32).
"""

from __future__ import annotations

import time
from itertools import combinations
from typing import Any, Sequence

DTYPES = ("float32", "bfloat16")


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(Kendall's tau-a, share of pairs ordered alike) of two score lists over the same candidates; a tie in either
    list counts as not alike. One candidate has no pairs: (1.0, 1.0)."""
    if len(a) != len(b):
        raise ValueError(f"kendall_tau: {len(a)} scores against {len(b)}")
    pairs = list(combinations(range(len(a)), 2))
    if not pairs:
        return 1.0, 1.0
    signs = [((a[i] > a[j]) - (a[i] < a[j])) * ((b[i] > b[j]) - (b[i] < b[j])) for i, j in pairs]
    return sum(signs) / len(pairs), sum(s > 0 for s in signs) / len(pairs)


def compare(exact: Sequence[Sequence[float]], other: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Drift of ``other`` from ``exact``, group by group: max abs and relative difference, and rank agreement."""
    flat = [(x, y) for g, w in zip(other, exact) for x, y in zip(g, w)]
    if not flat or len(other) != len(exact) or any(len(g) != len(w) for g, w in zip(other, exact)):
        raise ValueError("compare: the two sides must score the same groups")
    ranks = [kendall_tau(g, w) for g, w in zip(other, exact)]
    return {
        "candidates": len(flat),
        "max_abs_diff": max(abs(x - y) for x, y in flat),
        "max_rel_diff": max(abs(x - y) / max(abs(y), 1e-6) for x, y in flat),
        "kendall_tau": [round(t, 4) for t, _ in ranks],
        "pairs_alike": [round(s, 4) for _, s in ranks],
        "min_kendall_tau": min(t for t, _ in ranks),
        "min_pairs_alike": min(s for _, s in ranks),
    }


def _stream(n_groups: int, g: int, context_s: float, fps: float, size: tuple[int, int]):
    from .rl import make_groups

    return make_groups(n_groups, g, context_s, fps, size)


def _rate(fn, stream) -> tuple[list[list[float]], float, list[Any]]:
    """(rewards per group, candidates/s over the stream, the raw results) of ``fn(prompt, context, candidates)``."""
    t = time.perf_counter()
    results = [fn(p, c, cands) for p, c, cands in stream]
    dt = time.perf_counter() - t
    return [[r.reward for r in group] for group in results], sum(len(r) for r in results) / dt, results


def _dtype_rows(bundle, dtype: str, streams: dict[int, list], *, device, vllm_url, peak) -> list[dict[str, Any]]:
    from ..scoring.reward_model import RewardModel
    from .rl import group_flops

    rows = []
    exact = RewardModel.from_pretrained(bundle, device=device, dtype=dtype, exact=True)
    try:
        served = RewardModel.from_pretrained(bundle, dtype=dtype, backend="vllm", vllm_url=vllm_url)
    except BaseException:
        exact.close()
        raise
    try:
        warm = next(iter(streams.values()))[0]
        exact.score_group(warm[0], warm[1], warm[2][:2], exact=True)
        served.score_group(warm[0], warm[1], warm[2][:2], share_prefix=False)
        for g, stream in streams.items():
            want, nvrm_rate, _ = _rate(lambda p, c, cands: exact.score_group(p, c, cands, exact=True), stream)
            _, group_rate, _ = _rate(exact.score_group, stream)  # nvrm's fast path (shared prefix, not exact): the speed to beat
            got, vllm_rate, results = _rate(served.score_group, stream)
            alone, _, _ = _rate(lambda p, c, cands: served.score_group(p, c, cands, share_prefix=False), stream)
            prepared = exact.engine.prepare_group(stream[0][0], exact.prepare_video(stream[0][1], "context"),
                                                  [exact.prepare_video(c, "candidate") for c in stream[0][2]])
            flops = group_flops(exact, prepared)  # one group's model FLOPs (every group of the stream has the same shapes)
            row = {"dtype": dtype, "G": g, "groups": len(stream),
                   "candidates_per_s": {"nvrm_exact": nvrm_rate, "nvrm_group": group_rate, "vllm": vllm_rate},
                   "vllm_vs_nvrm_group": vllm_rate / group_rate, "drift": compare(want, got),
                   "prefix_cache": {"bit_identical_on_vs_off": got == alone,
                                    "max_abs_diff_on_vs_off": max(abs(x - y) for g1, g2 in zip(got, alone) for x, y in zip(g1, g2)),
                                    "cached_tokens_per_group": [[r.cached_tokens for r in grp] for grp in results[:2]]}}
            if peak:
                per_s = {k: flops * v / g / 1e12 for k, v in row["candidates_per_s"].items()}
                row["model_tflops"] = per_s
                row["peak_fraction"] = {k: v / peak for k, v in per_s.items()}
            rows.append(row)
    finally:
        served.close()
        exact.close()
    return rows


def run_backend_parity(arch: str = "mid", group_sizes: Sequence[int] = (8,), n_groups: int = 4, context_s: float = 2.0, fps: float = 8.0,
                       size: tuple[int, int] = (64, 96), *, device: str | None = None, vllm_url: str | None = None,
                       dtypes: Sequence[str] = DTYPES, measure_peak: bool = False) -> dict[str, Any]:
    """The backend-parity report (see the module docstring) on the ``arch`` bench bundle."""
    import torch

    from .harness import build_bench_bundle, device_name, peak_tflops

    bundle = build_bench_bundle(arch)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    peak = peak_tflops(dev, measure_peak)
    streams = {g: _stream(n_groups, g, context_s, fps, size) for g in group_sizes}
    rows = [row for dtype in dtypes for row in _dtype_rows(bundle, dtype, streams, device=device, vllm_url=vllm_url, peak=peak)]
    try:
        import vllm

        version = vllm.__version__
    except ImportError:
        version = None
    return {"workload": "backend-parity", "arch": arch, "device": str(dev), "device_name": device_name(dev), "vllm": version,
            "vllm_url": vllm_url, "frames": {"height": size[0], "width": size[1], "fps": fps, "context_s": context_s},
            "peak_tflops": peak, "rows": rows}


def format_backend_parity(report: dict[str, Any]) -> str:
    """The report as a table: speed side by side, drift, rank agreement and the prefix-cache check per (dtype, G)."""
    f = report["frames"]
    where = report["vllm_url"] or f"vLLM {report['vllm']} in process"
    lines = [f"backend-parity: arch={report['arch']} device={report['device']} ({report['device_name']}), {where}; "
             f"frames {f['width']}x{f['height']} @ {f['fps']:g} fps, {f['context_s']:g} s context",
             "| dtype | G | nvrm exact cand/s | nvrm group cand/s | vLLM cand/s | vLLM vs nvrm group | max |Δ| | max rel | min Kendall τ "
             "| min pairs alike | cache on vs off | MFU nvrm group / vLLM |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in report["rows"]:
        c, d = r["candidates_per_s"], r["drift"]
        mfu = f"{100 * r['peak_fraction']['nvrm_group']:.1f}% / {100 * r['peak_fraction']['vllm']:.1f}%" if "peak_fraction" in r else "-"
        pc = r["prefix_cache"]
        cache = "bit-identical" if pc["bit_identical_on_vs_off"] else f"max |Δ| {pc['max_abs_diff_on_vs_off']:.2g}"
        lines.append(f"| {r['dtype']} | {r['G']} | {c['nvrm_exact']:.2f} | {c['nvrm_group']:.2f} | {c['vllm']:.2f} | {r['vllm_vs_nvrm_group']:.2f}x "
                     f"| {d['max_abs_diff']:.3g} | {d['max_rel_diff']:.3g} | {d['min_kendall_tau']:.2f} | {d['min_pairs_alike']:.2f} "
                     f"| {cache} | {mfu} |")
    lines.append("float32 is held to 1e-5 in the tests; bfloat16 drift is measured, not promised (docs/contract.md)")
    return "\n".join(lines)
