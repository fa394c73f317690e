"""After the search: measure the planned configuration against the shipped one, and build the `Plan`.

`measure_plan` measures the peak and step time of the planned and shipped configurations (and
what the safe sites kept on save together); `build_plan` turns the search's evidence and these
measurements into one `Decision` per site, with its reason, and the `Plan`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import torch

from ...printing import fmt_bytes
from ..memory import MemoryReport
from ..preserve import tensors_in
from .checkpoint import saved_by_module
from .plan import Decision, Plan
from .search import Decided, Search


@dataclass
class Measured:
    """The planned and shipped configurations, measured."""

    planned: MemoryReport
    shipped: MemoryReport | None  # None: the shipped configuration raises
    shipped_error: str | None
    kept_as_group: set[str]  # safe sites kept on, whose saving was measured together
    time_planned: float
    time_shipped: float | None


def measure_plan(search: Search, decided: Decided) -> Measured:
    """Peaks of the planned and shipped configurations and their step times; the saving of the
    safe sites kept on (switched off together) goes into `decided.savings`."""
    plan_flags, savings = decided.plan_flags, decided.savings
    search.say("measuring the planned and shipped configurations")
    mem_planned = search.measure(plan_flags)
    safe_on = [p for p in search.executed if p not in search.unsafe and plan_flags[p] and p not in savings]
    if safe_on:
        search.say(f"measuring the {len(safe_on)} safe sites kept on, switched off together")
        group = search.measure({**plan_flags, **{p: False for p in safe_on}}).peak - mem_planned.peak
        for p in safe_on:
            savings[p] = group
    mem_shipped: MemoryReport | None = None
    shipped_error = None
    try:
        mem_shipped = search.measure(search.shipped)
    except RuntimeError as e:
        shipped_error = textwrap.shorten(str(e).splitlines()[0], 400, placeholder=" ...")
    search.rng.restore()
    time_shipped: float | None = None
    # plan_flags covers the executed modules only; the others stay as shipped.
    changes_flags = any(flag != search.shipped[path] for path, flag in plan_flags.items())
    if mem_shipped is not None and changes_flags:
        time_planned, time_shipped = search.times(plan_flags, search.shipped)
    else:  # one configuration to time: the plan changes no flag, or the shipped one raises
        (time_planned,) = search.times(plan_flags)
        if mem_shipped is not None:
            time_shipped = time_planned
    return Measured(mem_planned, mem_shipped, shipped_error, set(safe_on), time_planned, time_shipped)


def build_plan(search: Search, decided: Decided, measured: Measured, input_specs: list[str] | None) -> Plan:
    """One decision per module site and per functional call, and the plan around them."""
    decisions = _module_decisions(search, decided, measured)
    for call in search.call_sites:
        evidence = search.unsafe_calls.get(call, [])
        under = sorted(search.calls_under_flags.get(call, ()))
        safe = ("safe: no finding names this call" if not under else
                f"safe apart from its writes under the `inplace` flag of {', '.join(under)}, decided above")
        decisions.append(
            Decision(
                site=call, kind="call", module_type=None, shipped=True, inplace=not evidence,
                safe=not evidence, reason=("unsafe: " + evidence[0]) if evidence else safe, evidence=evidence,
            )
        )
    model = search.model
    plan = Plan(
        target=type(model).__name__,
        mode="train" if model.training else "eval",
        inputs=input_specs or [_spec(t) for t in tensors_in((search.args, search.kwargs))],
        optimizer=measured.planned.optimizer,
        optimizer_settings=measured.planned.optimizer_settings,
        decisions=decisions,
        peak_shipped=measured.shipped.peak if measured.shipped is not None else None,
        peak_planned=measured.planned.peak,
        time_shipped=measured.time_shipped,
        time_planned=measured.time_planned,
        verified=decided.verified,
        memory_shipped=measured.shipped,
        memory_planned=measured.planned,
        shipped_error=measured.shipped_error,
        other_findings=decided.other,
        saved_by_module=saved_by_module(measured.planned),
        all_paths=list(search.modules),
    )
    if not search.modules:
        plan.notes.append("no module has an `inplace` option")
    return plan


def _module_decisions(search: Search, decided: Decided, measured: Measured) -> list[Decision]:
    shipped, unsafe, savings, plan_flags = search.shipped, search.unsafe, decided.savings, decided.plan_flags
    kept_as_group, mem_shipped = measured.kept_as_group, measured.shipped
    out = []
    for path, module in search.modules.items():
        kind = type(module).__name__
        if path not in search.executed:
            out.append(Decision(path, "module", kind, shipped[path], shipped[path], None,
                                "not executed by the traced run: left as shipped"))
            continue
        flag = plan_flags[path]
        if path in unsafe:
            evidence = unsafe[path]
            effect = (mem_shipped.peak - decided.base_peak) if (mem_shipped is not None and shipped[path]) else None
            reason = "unsafe: " + evidence[0]
            if shipped[path]:
                n = sum(1 for p in unsafe if shipped.get(p))
                if mem_shipped is None:  # which of them raised is not measured: they are switched off together
                    reason += f"; the shipped configuration raises, and runs with the {n} unsafe site(s) switched off"
                else:
                    reason += f"; the {n} unsafe site(s) switched off together change the peak by {fmt_bytes(-(effect or 0))}"
            out.append(Decision(path, "module", kind, shipped[path], False, False, reason,
                                saves_bytes=effect, evidence=evidence))
        elif path in kept_as_group:
            n = len(kept_as_group)
            saving = savings[path]
            what = f"save {fmt_bytes(saving)}" if saving else "save 0 bytes"
            reason = f"safe, kept as shipped; the {n} kept safe sites together {what} at the peak (measured)"
            out.append(Decision(path, "module", kind, shipped[path], flag, True, reason, saves_bytes=saving))
        elif path in savings:
            saving = savings[path]
            if flag:
                reason = f"safe, lowers the peak by {fmt_bytes(saving)}"
            else:
                reason = "safe, saves 0 bytes at the peak: left off (enabling it adds risk for no gain)"
            out.append(Decision(path, "module", kind, shipped[path], flag, True, reason, saves_bytes=saving))
        elif path in search.hooked and not flag:
            out.append(Decision(path, "module", kind, shipped[path], flag, True,
                                "no finding names it, but left off: a forward hook on it is handed its input, "
                                "which in place it overwrites (what the hook keeps would change)"))
        else:
            out.append(Decision(path, "module", kind, shipped[path], flag, True, "safe: kept as shipped"))
    return out


def _spec(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) + ":" + str(t.dtype).removeprefix("torch.")
