"""A self-contained HTML ranking report: the frames the model saw, rewards, ranks, P matrix.

Images are embedded as lossless PNG data URIs of the exact contract-prepared
frames (after resize, JPEG round trip and smart resize), so the file opens
anywhere with nothing beside it. A few lines of script record on ``<body>``
how many images decoded, which the browser test reads back.
"""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime, timezone
from typing import Sequence

from PIL import Image

from ..video.inputs import PreparedVideo
from .ranking import pairwise_matrix, rank_rewards

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#57606a;font-size:13px} .prompt{font-size:15px;margin:10px 0 4px;white-space:pre-wrap}
.strip{display:flex;gap:6px;overflow-x:auto;padding:4px 0}
figure{margin:0;text-align:center} figure img{display:block;height:112px;width:auto;border:1px solid #d0d7de}
figcaption{font-size:11px;color:#57606a}
.cand{border:1px solid #d0d7de;border-radius:8px;padding:10px 12px;margin:10px 0}
.cand.best{border:2px solid #1a7f37;background:#f6fff8}
.head{display:flex;gap:18px;align-items:baseline;flex-wrap:wrap}
.rank{font-size:20px;font-weight:700} .reward{font-family:ui-monospace,monospace;font-size:15px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #d0d7de;padding:4px 8px;text-align:center}
th{background:#f6f8fa}
"""

SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++;
  document.body.setAttribute('data-images-ok', String(ok));
  document.body.setAttribute('data-images-total', String(imgs.length));
});
"""


def png_data_uri(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _strip(video: PreparedVideo, label: str) -> str:
    figs = []
    for k, (img, t) in enumerate(zip(video.images, video.times)):
        alt = html.escape(f"{label} frame {k} at {t:.3f} s")
        figs.append(
            f'<figure><img src="{png_data_uri(img)}" alt="{alt}" width="{img.width}" height="{img.height}">'
            f"<figcaption>{t:.2f} s · {img.width}×{img.height}</figcaption></figure>"
        )
    return '<div class="strip">' + "".join(figs) + "</div>"


def _cell_color(p: float) -> str:
    # white at 0.5, green toward 1, red toward 0
    a = abs(p - 0.5) * 2
    return f"rgba(26,127,55,{a:.2f})" if p > 0.5 else f"rgba(207,34,46,{a:.2f})"


def render_rank_report(
    prompt: str,
    context: PreparedVideo,
    candidates: Sequence[PreparedVideo],
    rewards: Sequence[float],
    *,
    names: Sequence[str],
    model_info: dict,
) -> str:
    """The whole report as one HTML string."""
    ranked = rank_rewards(rewards)
    matrix = pairwise_matrix(rewards)
    esc = html.escape
    parts = [
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>nvrm ranking: {esc(prompt[:60])}</title><style>{CSS}</style><script>{SCRIPT}</script></head><body>",
        "<h1>nvrm ranking report</h1>",
        f'<div class="meta">model {esc(str(model_info.get("path") or ""))} · revision {esc(str(model_info.get("revision")))}'
        f' · contract {esc(str(model_info.get("contract", ""))[:16])} · {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}</div>',
        f'<div class="prompt"><b>Prompt:</b> {esc(prompt)}</div>',
        f"<h2>Context: {esc(names[0] if names else context.source)} ({len(context.images)} frames)</h2>",
        _strip(context, "context"),
        "<h2>Candidates, best first</h2>",
    ]
    for r in ranked:
        cand = candidates[r.index]
        best = " best" if r.rank == 1 else ""
        parts.append(
            f'<section class="cand{best}" id="cand-{r.index}"><div class="head">'
            f'<span class="rank">#{r.rank}</span><span class="reward">reward {r.reward:+.4f}</span>'
            f"<span>P(top) {r.p_top:.3f}</span>"
            + ("" if r.rank == 1 else f"<span>P(#1 ≻ this) {r.p_best_over:.3f}</span>")
            + f"<span>{esc(names[r.index + 1] if len(names) > r.index + 1 else cand.source)}</span></div>"
            + _strip(cand, f"candidate {r.index}")
            + "</section>"
        )
    order = [r.index for r in ranked]
    parts.append("<h2>P(row preferred over column), Bradley–Terry</h2><table><tr><th></th>")
    parts += [f"<th>#{k + 1} (c{i})</th>" for k, i in enumerate(order)]
    parts.append("</tr>")
    for k, i in enumerate(order):
        parts.append(f"<tr><th>#{k + 1} (c{i})</th>")
        for j in order:
            p = matrix[i][j]
            cell = "—" if i == j else f"{p:.3f}"
            parts.append(f'<td style="background:{_cell_color(p) if i != j else "#f6f8fa"}">{cell}</td>')
        parts.append("</tr>")
    parts.append("</table></body></html>")
    return "".join(parts)
