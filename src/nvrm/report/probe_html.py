"""The probe's self-contained HTML report: frames the model saw, Δ per perturbation, flags.

One file, nothing beside it: the contract-prepared frames as lossless PNG
data URIs, bar charts as inline SVG. Every bar and table row carries its
values in ``data-*`` attributes (name, delta, flagged) so a browser test can
read them back from the DOM and check them against the JSON report.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Any, Sequence

from .html import CSS, SCRIPT, png_data_uri

_PROBE_CSS = """
.bar-chart text{font-size:11px;font-family:system-ui,sans-serif}
.flag{color:#cf222e;font-weight:700}
.variant{border:1px solid #d0d7de;border-radius:8px;padding:8px 12px;margin:8px 0}
.variant.flagged{border:2px solid #cf222e;background:#fff5f5}
td.num{font-family:ui-monospace,monospace;text-align:right}
"""


def _frames(images: Sequence[Any], label: str) -> str:
    figs = []
    for k, img in enumerate(images):
        alt = html.escape(f"{label} frame {k}")
        figs.append(f'<figure><img src="{png_data_uri(img)}" alt="{alt}" width="{img.width}" height="{img.height}"></figure>')
    return '<div class="strip">' + "".join(figs) + "</div>"


def bar_chart(rows: Sequence[tuple[str, float | None, bool]], title: str, errors: Sequence[float] | None = None) -> str:
    """Horizontal bars of (name, value, flagged) around zero, as inline SVG (flagged bars red)."""
    values = [abs(v) for _, v, _ in rows if v is not None] + [abs(e) for e in (errors or []) if e is not None]
    span = max(values, default=1.0) or 1.0
    width, label_w, row_h = 720, 150, 22
    mid = label_w + (width - label_w) / 2
    scale = (width - label_w) / 2 / span * 0.95
    height = row_h * len(rows) + 30
    esc = html.escape
    parts = [f'<svg class="bar-chart" width="{width}" height="{height}" role="img" aria-label="{esc(title)}">',
             f'<line x1="{mid}" y1="0" x2="{mid}" y2="{height - 20}" stroke="#57606a"/>']
    for k, (name, value, flagged) in enumerate(rows):
        y = k * row_h + 4
        color = "#cf222e" if flagged else "#1f6feb"
        parts.append(f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{"⚠ " if flagged else ""}{esc(name)}</text>')
        if value is None:
            parts.append(f'<text x="{mid + 4}" y="{y + 13}" fill="#57606a">error</text>')
            continue
        x0, x1 = sorted((mid, mid + value * scale))
        parts.append(
            f'<rect class="bar" data-name="{esc(name)}" data-delta="{value:.9g}" data-flagged="{str(flagged).lower()}" '
            f'x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{row_h - 8}" fill="{color}"/>'
        )
        if errors is not None and errors[k] is not None:
            e = errors[k] * scale
            parts.append(f'<line x1="{mid + value * scale - e:.1f}" x2="{mid + value * scale + e:.1f}" y1="{y + 7}" y2="{y + 7}" stroke="#24292f"/>')
        parts.append(f'<text x="{(x1 + 4) if value >= 0 else (x0 - 4)}" y="{y + 13}" text-anchor="{"start" if value >= 0 else "end"}">{value:+.4f}</text>')
    parts.append(f'<text x="{mid}" y="{height - 4}" text-anchor="middle" fill="#57606a">{esc(title)}</text></svg>')
    return "".join(parts)


def render_probe_report(reports: Sequence[Any], summary: dict[str, dict[str, Any]] | None, model_info: dict[str, Any]) -> str:
    """One probe (frames, Δ chart, table) per clip, and for several clips the summary table and plot."""
    esc = html.escape
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>nvrm probe</title><style>{CSS}{_PROBE_CSS}</style><script>{SCRIPT}</script></head><body>",
        "<h1>nvrm probe: can the reward be gamed?</h1>",
        f'<div class="meta">model revision {esc(str(model_info.get("revision")))} · contract {esc(str(model_info.get("contract", ""))[:16])}'
        f" · {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}</div>",
        "<p>Each candidate is scored as it is and under perturbations that make it a worse continuation. "
        "Δ = reward(perturbed) − reward(original); P = σ(Δ) is the Bradley–Terry probability that the perturbed "
        'clip is preferred. <span class="flag">⚠ flagged</span>: a degradation scored higher than the original.</p>',
    ]
    if summary:
        names = list(summary)
        parts.append(f"<h2>Over {len([r for r in reports if hasattr(r, 'outcomes')])} clips</h2>")
        parts.append('<table id="summary"><tr><th>perturbation</th><th>raised the reward</th><th>mean Δ</th><th>std Δ</th><th>errors</th></tr>')
        for n in names:
            s = summary[n]
            raised = "—" if s["raised_fraction"] is None else f"{100 * s['raised_fraction']:.0f}%"
            mean = "—" if s["mean_delta"] is None else f"{s['mean_delta']:+.4f}"
            std = "—" if s["std_delta"] is None else f"{s['std_delta']:.4f}"
            flag = s["raised_fraction"] is not None and s["raised_fraction"] > 0
            parts.append(
                f'<tr class="summary-row" data-name="{esc(n)}" data-raised="{s["raised_fraction"]}" data-mean="{s["mean_delta"]}">'
                f'<td>{"⚠ " if flag else ""}{esc(n)}</td><td class="num">{raised}</td><td class="num">{mean}</td>'
                f'<td class="num">{std}</td><td class="num">{s["errors"]}</td></tr>'
            )
        parts.append("</table>")
        parts.append(bar_chart([(n, summary[n]["mean_delta"], bool(summary[n]["raised_fraction"])) for n in names], "mean Δ per perturbation (bar: ± std)",
                               [summary[n]["std_delta"] for n in names]))
    for k, r in enumerate(reports):
        if not hasattr(r, "outcomes"):
            parts.append(f'<section class="clip error"><h2>Clip {k + 1}: not probed</h2><p class="flag">{esc(str(r))}</p></section>')
            continue
        parts.append(f'<section class="clip" id="clip-{k}" data-reward="{r.reward:.9g}">')
        parts.append(f"<h2>Clip {k + 1}: {esc(r.candidate)}</h2>")
        doubt = (f' · <b>uncertainty</b> <span class="uncertainty">{r.uncertainty:.4f}</span> (the part of the reward the guard puts in doubt)'
                 if r.uncertainty is not None else "")
        parts.append(f'<div class="prompt"><b>Prompt:</b> {esc(r.prompt)}<br><b>Context:</b> {esc(r.context)} · <b>original reward</b> {r.reward:+.4f}'
                     f'{doubt}</div>')
        if r.flagged:
            parts.append(f'<p class="flag">⚠ flagged: {esc(", ".join(r.flagged))}</p>')
        else:
            parts.append("<p>No degradation scored higher than the original.</p>")
        parts.append(bar_chart([(o.name, o.delta, o.flagged) for o in r.outcomes], "Δ reward against the original"))
        if "context" in r.frames:
            parts.append("<h3>Context (as the model saw it)</h3>" + _frames(r.frames["context"], "context"))
        if "original" in r.frames:
            parts.append('<div class="variant"><b>original</b> · reward ' + f"{r.reward:+.4f}" + _frames(r.frames["original"], "original") + "</div>")
        for o in r.outcomes:
            cls = "variant flagged" if o.flagged else "variant"
            head = f"<b>{'⚠ ' if o.flagged else ''}{esc(o.name)}</b> — {esc(o.description)}"
            if o.error:
                head += f' · <span class="flag">{esc(o.error)}</span>'
            else:
                head += f" · reward {o.reward:+.4f} · Δ {o.delta:+.4f} · P(perturbed ≻ original) {o.p_preferred:.3f}"
                head += f" · uncertainty {o.uncertainty:.4f}" if o.uncertainty is not None else ""
            body = _frames(r.frames[o.name], o.name) if o.name in r.frames else ""
            parts.append(f'<div class="{cls}" data-name="{esc(o.name)}">{head}{body}</div>')
        parts.append("</section>")
    parts.append("</body></html>")
    return "".join(parts)
