"""Terminal view of an optimize Plan: every decision with its reason and measured effect; `str(plan)`."""

from __future__ import annotations

from ..engines.optimize import Plan
from ..printing import fmt_bytes, renders_text
from .memory_text import optimizer_text, peak_lines


def _flag(value: bool) -> str:
    return "on " if value else "off"


def _decision_lines(plan: Plan) -> list[str]:
    """The plan's decisions: the module flags (by glob where alike), the functional calls, and the
    findings no flag controls."""
    lines: list[str] = []
    groups = plan.module_groups()  # sites under one glob, as inplace.toml writes them, when alike
    if groups:
        lines.append("module inplace flags (shipped -> planned):")
        width = max(len(site or "<root>") for site, _ in groups)
        for site, members in groups:
            d = members[0]
            mark = "*" if d.changed else " "
            reason = d.reason if len(members) == 1 else f"{len(members)} modules: {d.reason}"
            lines.append(f" {mark} {site or '<root>':<{width}}  {_flag(d.shipped)} -> {_flag(d.inplace)}  {reason}")
    calls = [d for d in plan.decisions if d.kind == "call"]
    if calls:
        lines.append("functional inplace=True calls (change the line itself):")
        for d in calls:
            action = "keep" if d.inplace else "change to inplace=False"
            lines.append(f"   {d.site}: {action} ({d.reason})")
    if not plan.decisions:
        lines.append("no in-place site: nothing to decide")
    for f in plan.other_findings:
        lines.append(f"other finding, not controlled by a flag: {f.code} {f.message.splitlines()[0]}")
    return lines


def plan_lines(plan: Plan) -> list[str]:
    """The lines of `str(plan)`: the decisions, then what they were measured to do."""
    opt = optimizer_text(plan.optimizer, plan.optimizer_settings)
    lines = [f"inplace-doctor optimize: {plan.target}, {plan.mode} mode, {opt}, inputs {', '.join(plan.inputs)}", ""]
    lines += _decision_lines(plan)
    lines.append("")
    shipped = (
        fmt_bytes(plan.peak_shipped) if plan.peak_shipped is not None else f"raises ({plan.shipped_error})"
    )
    delta = ""
    if plan.peak_shipped is not None:
        diff = plan.peak_shipped - plan.peak_planned
        delta = f", {fmt_bytes(diff)} saved" if diff > 0 else (" (no change)" if diff == 0 else f", {fmt_bytes(-diff)} more")
    lines.append(f"peak memory: shipped {shipped}, planned {fmt_bytes(plan.peak_planned)}{delta}")
    if plan.time_shipped is not None and not any(d.changed for d in plan.decisions if d.kind == "module"):
        lines.append(f"step time: {plan.time_planned * 1e3:.1f} ms (the plan changes no flag: one configuration, timed once)")
    elif plan.time_shipped is not None and plan.time_shipped > 0:
        lines.append(
            f"step time: shipped {plan.time_shipped * 1e3:.1f} ms, planned {plan.time_planned * 1e3:.1f} ms "
            f"(x{plan.time_planned / plan.time_shipped:.2f}; timings vary by a few percent run to run)"
        )
    lines.append(f"verify: {plan.verified}")
    if plan.saved_by_module:
        lines.append("")
        # No entry contains another: a parent beside its own child would count the same bytes twice.
        lines.append("what would save memory: saved activations at the end of forward, by module (none nested in another)")
        for name, nbytes in plan.largest_holders(5):
            lines.append(f"  {fmt_bytes(nbytes):>11}  {name}")
    cp = plan.checkpoint
    if cp is not None:
        saved = cp.peak_before - cp.peak_after
        effect = f"{fmt_bytes(saved)} saved" if saved > 0 else ("no saving" if saved == 0 else f"{fmt_bytes(-saved)} more")
        lines.append(
            f"checkpointing {cp.module} (measured): peak {fmt_bytes(cp.peak_before)} -> {fmt_bytes(cp.peak_after)} "
            f"({effect}), step time x{cp.time_ratio:.2f}"
        )
        lines += [f"  caveat: {c}" for c in cp.caveats]
    elif plan.checkpoint_declined:
        lines.append(f"checkpointing: {plan.checkpoint_declined}")
    peak = plan.memory_planned.peak_phase if plan.memory_planned.peaks else None
    if peak is not None:
        lines.append("")
        lines += peak_lines(peak, top=4)
    lines += [f"note: {n}" for n in plan.notes]
    return lines


@renders_text(Plan)
def plan_to_plain_text(plan: Plan) -> str:
    return "\n".join(plan_lines(plan)) + "\n"
