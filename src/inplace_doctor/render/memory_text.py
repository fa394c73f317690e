"""Compact terminal view of a MemoryReport: the phase peaks and who holds the largest; `str(report)`."""

from __future__ import annotations

from typing import Any

from ..engines.memory import Category, MemoryReport, Peak
from ..printing import fmt_bytes, renders_text


def optimizer_text(name: str | None, groups: tuple[dict[str, Any], ...]) -> str:
    """The optimizer with the settings that decide its update and its state: `SGD (momentum 0.9,
    Nesterov, weight decay 0.0005, lr 0.1)`, `SGD (no momentum, lr 0.01)`, `AdamW (betas (0.9, 0.999),
    decoupled weight decay 0.01, lr 0.001)`; the first group's, when its parameter groups differ."""
    if not name:
        return "no optimizer"
    if not groups:
        return name
    g = groups[0]
    said = []
    if "momentum" in g and (g["momentum"] or name == "SGD"):
        said.append(f"momentum {g['momentum']:g}" if g["momentum"] else "no momentum")
    said += ["Nesterov"] if g.get("nesterov") else []
    said += [f"dampening {g['dampening']:g}"] if g.get("dampening") else []
    said += [f"betas ({', '.join(f'{b:g}' for b in g['betas'])})"] if g.get("betas") else []
    said += ["AMSGrad"] if g.get("amsgrad") else []
    said += ["centered"] if g.get("centered") else []
    if g.get("weight_decay"):
        decoupled = name == "AdamW" or g.get("decoupled_weight_decay")
        kind = "decoupled " if decoupled else "L2 " if "Adam" in name else ""  # Adam's adds to the gradient
        said.append(f"{kind}weight decay {g['weight_decay']:g}")
    said += ["maximizing"] if g.get("maximize") else []
    said += [f"lr {g['lr']:g}"] if isinstance(g.get("lr"), (int, float)) else []
    if len(groups) > 1:
        said.append(f"{len(groups)} parameter groups" + (", the first's settings" if any(x != g for x in groups) else ""))
    return f"{name} ({', '.join(said)})" if said else name


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
    opt = f", {optimizer_text(report.optimizer, report.optimizer_settings)}"
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
