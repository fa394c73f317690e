"""Compact terminal view of a MemoryReport: the phase peaks and who holds the largest; `str(report)`."""

from __future__ import annotations

from ..engines.memory import Category, MemoryReport, Peak
from ..printing import fmt_bytes, renders_text


def _when(peak: Peak) -> str:
    where = f" in {peak.where}" if peak.where else ""
    return f"after op {peak.op_index} ({peak.op}{where})"


def peak_lines(peak: Peak, top: int = 6) -> list[str]:
    lines = [f"at the {peak.phase} peak, {fmt_bytes(peak.nbytes)} ({peak.nbytes:,} bytes), {_when(peak)}:"]
    for category, nbytes in sorted(peak.by_category.items(), key=lambda kv: -kv[1]):
        if nbytes:
            lines.append(f"  {category:<18}{fmt_bytes(nbytes):>12}")
    detailed = [h for h in peak.holdings if h.category in (Category.SAVED, Category.TEMPORARIES)][:top]
    if detailed:
        lines.append("  largest saved activations and temporaries:")
        for h in detailed:
            where = " ".join(x for x in (h.where, h.location) if x)
            count = f" x{h.tensors}" if h.tensors > 1 else ""
            lines.append(f"    {fmt_bytes(h.nbytes):>11}  {h.label}{count}  {where}".rstrip())
    if peak.allocator_peak is not None:
        lines.append(f"  CUDA allocator peak in this phase: {fmt_bytes(peak.allocator_peak)}")
    return lines


def memory_lines(report: MemoryReport) -> list[str]:
    opt = f", {report.optimizer}" if report.optimizer else ", no optimizer"
    lines = [
        f"inplace-doctor memory: {report.target}, {report.mode} mode{opt}, {report.steps} step(s) on {report.device}",
        f"peak {fmt_bytes(report.peak)} ({report.peak:,} bytes); last step started at {fmt_bytes(report.baseline)}",
        "",
    ]
    for phase, peak in report.peaks.items():
        lines.append(f"  {phase:<10}{fmt_bytes(peak.nbytes):>12}  {_when(peak)}")
    top = report.peak_phase if report.peaks else None
    if top is not None:
        lines.append("")
        lines += peak_lines(top)
        forward = report.peaks.get("forward")
        if forward is not None and forward is not top:  # what autograd keeps for backward
            lines.append("")
            lines += peak_lines(forward, top=4)
    lines += [f"note: {n}" for n in report.notes]
    return lines


@renders_text(MemoryReport)
def memory_to_plain_text(report: MemoryReport) -> str:
    return "\n".join(memory_lines(report)) + "\n"
