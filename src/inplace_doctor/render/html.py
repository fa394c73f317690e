"""One self-contained HTML file: findings, the memory timeline as an inline SVG chart,
and the peak breakdowns. No script and no external resource: it opens offline."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..printing import fmt_bytes

if TYPE_CHECKING:
    from ..engines.memory import MemoryReport, Peak
    from ..engines.optimize import Plan
    from ..report import Report

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;font-size:.9em}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.error{color:#b00020}.warning{color:#a66300}.info{color:#0b5394}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em;white-space:pre-wrap}
.legend span{display:inline-block;margin-right:1.5em}.sw{display:inline-block;width:1em;height:.6em;margin-right:.3em}
.changed{font-weight:bold}
"""
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def _e(text: object) -> str:
    return html.escape(str(text))


def timeline_svg(series: Sequence[tuple[str, MemoryReport]], width: int = 1000, height: int = 320) -> str:
    """Live bytes after each op of the last measured step, one polyline per report."""
    rows = [(label, r.timeline) for label, r in series if r.timeline]
    if not rows:
        return "<p>no timeline</p>"
    top = max(b for _, t in rows for *_, b in t) or 1
    low = min(b for _, t in rows for *_, b in t)
    low = max(0, int(low - (top - low) * 0.1))
    span = (top - low) or 1
    n = max(len(t) for _, t in rows)
    left, right, upper, lower = 80, 10, 10, 30
    w, h = width - left - right, height - upper - lower

    def xy(i: int, b: int) -> str:
        x = left + (i / max(1, n - 1)) * w
        y = upper + h - ((b - low) / span) * h
        return f"{x:.1f},{y:.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="memory-timeline" role="img" '
        f'aria-label="live bytes after each op" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<rect x="{left}" y="{upper}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for k in range(5):
        value = low + span * k / 4
        y = upper + h - h * k / 4
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_e(fmt_bytes(int(value)))}</text>')
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    # phase boundaries of the first series
    first = rows[0][1]
    previous = None
    for i, (_, phase, _, _) in enumerate(first):
        if phase != previous and phase in ("forward", "backward", "optimizer"):
            x = left + (i / max(1, n - 1)) * w
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{upper}" y2="{upper + h}" stroke="#999" stroke-dasharray="4 3"/>')
            parts.append(f'<text x="{x + 3:.1f}" y="{upper + h + 14}" font-size="11">{_e(phase)}</text>')
        previous = phase
    for k, (label, timeline) in enumerate(rows):
        points = " ".join(xy(i, b) for i, (*_, b) in enumerate(timeline))
        color = _COLORS[k % len(_COLORS)]
        parts.append(f'<polyline class="series" data-label="{_e(label)}" fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
    parts.append("</svg>")
    legend = "".join(
        f'<span><i class="sw" style="background:{_COLORS[k % len(_COLORS)]}"></i>{_e(label)} '
        f"(peak {_e(fmt_bytes(max(b for *_, b in t)))})</span>"
        for k, (label, t) in enumerate(rows)
    )
    return "".join(parts) + f'<p class="legend">{legend}</p>'


def _peak_table(peak: Peak) -> str:
    rows = "".join(
        f'<tr><td>{_e(c)}</td><td class="n">{_e(fmt_bytes(b))}</td><td class="n">{b:,}</td></tr>'
        for c, b in sorted(peak.by_category.items(), key=lambda kv: -kv[1]) if b
    )
    detail = "".join(
        f'<tr><td>{_e(h.category)}</td><td>{_e(h.label)}</td><td>{_e(h.where)}</td><td>{_e(h.location or "")}</td>'
        f'<td class="n">{h.tensors}</td><td class="n">{_e(fmt_bytes(h.nbytes))}</td></tr>'
        for h in peak.holdings[:25]
    )
    where = f" in {peak.where}" if peak.where else ""
    return (
        f"<h3>{_e(peak.phase)} peak: {_e(fmt_bytes(peak.nbytes))} after op {peak.op_index} ({_e(peak.op)}{_e(where)})</h3>"
        f"<table><tr><th>category</th><th>size</th><th>bytes</th></tr>{rows}</table>"
        "<table><tr><th>category</th><th>what</th><th>module / node</th><th>saved at</th><th>tensors</th><th>size</th></tr>"
        f"{detail}</table>"
    )


def memory_section(series: Sequence[tuple[str, MemoryReport]]) -> str:
    out = ["<h2>Memory</h2>", timeline_svg(series)]
    for label, report in series:
        out.append(f"<h3>{_e(label)}: peak {_e(fmt_bytes(report.peak))} ({report.peak:,} bytes)</h3>")
        for peak in report.peaks.values():
            out.append(_peak_table(peak))
    return "".join(out)


def findings_section(report: Report) -> str:
    from .text import finding_lines

    if not report.findings:
        return "<h2>Findings</h2><p>No findings.</p>"
    items = []
    for f in report.findings:
        body = "\n".join(text for text, _ in finding_lines(f, report.root_label))
        items.append(f'<div class="finding"><pre class="{_e(f.severity.value)}">{_e(body)}</pre></div>')
    return f"<h2>Findings ({len(report.findings)})</h2>" + "".join(items)


def plan_section(plan: Plan) -> str:
    rows = "".join(
        f'<tr class="{"changed" if d.changed else ""}"><td>{_e(d.site or "<root>")}</td><td>{_e(d.kind)}</td>'
        f"<td>{'on' if d.shipped else 'off'}</td><td>{'on' if d.inplace else 'off'}</td>"
        f'<td>{_e(d.reason)}</td><td class="n">{_e(fmt_bytes(d.saves_bytes) if d.saves_bytes is not None else "")}</td></tr>'
        for d in plan.decisions
    )
    return (
        "<h2>Decisions</h2><table><tr><th>site</th><th>kind</th><th>shipped</th><th>planned</th><th>reason</th>"
        f"<th>saves</th></tr>{rows}</table><p>verify: {_e(plan.verified)}</p>"
    )


def page(title: str, sections: Sequence[str]) -> str:
    from .._version import __version__

    return (  # the generator tag is how the tool knows its own page before replacing it (cli/provenance.py)
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="generator" content="inplace-doctor {_e(__version__)}">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>" + "".join(sections) + "</body></html>\n"
    )


def write_html(
    path: str,
    title: str,
    *,
    report: Report | None = None,
    plan: Plan | None = None,
    memory: Sequence[tuple[str, MemoryReport]] = (),
) -> None:
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(html_page(title, report=report, plan=plan, memory=memory))


def html_page(
    title: str,
    *,
    report: Report | None = None,
    plan: Plan | None = None,
    memory: Sequence[tuple[str, MemoryReport]] = (),
) -> str:
    """The whole page: findings, the plan's decisions, the memory timeline, as they apply."""
    sections = []
    if report is not None:
        sections.append(findings_section(report))
    if plan is not None:
        sections.append(plan_section(plan))
        memory = list(memory) + plan.memory_series()
    if memory:
        sections.append(memory_section(memory))
    return page(title, sections)


def write_png(path: str, series: Sequence[tuple[str, MemoryReport]]) -> bool:
    """The timeline chart as a PNG via matplotlib; False when matplotlib is not installed."""
    data = png_bytes(series)
    if data is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data is not None


def png_bytes(series: Sequence[tuple[str, MemoryReport]]) -> bytes | None:
    """The timeline chart as PNG bytes via matplotlib; None when matplotlib is not installed."""
    import io

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for label, r in series:
        ax.plot([i for i, *_ in r.timeline], [b / 2**20 for *_, b in r.timeline], label=label, linewidth=1)
    ax.set_xlabel("op in the last step")
    ax.set_ylabel("live MiB")
    ax.legend()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": "inplace-doctor"})  # how --png knows its own file later
    plt.close(fig)
    return out.getvalue()
