"""optimize: decide, per call site, whether in-place is safe; measure what it saves.

    plan = ipd.optimize(model, x, optimizer=opt)
    plan.apply(model)              # or ipd.apply_config(model, "inplace.toml")
    plan.write("inplace.toml")

How a decision is made, for every module with an `inplace` option that the
traced run executed (a module called from several places is one site: it is
safe only if every call is):

1. Unsafe: audit the model with every such flag on; a site is unsafe when an
   error or warning finding names its write (IPD101 a saved tensor, IPD105 a
   later read, IPD106 the caller's input, IPD102/103 a leaf or view, ...).
   Turn those off and audit again until no finding names a flag: one site's
   write can reach another's tensor only through aliasing the first created.
2. Effect: measure the training step's peak (`ipd.memory`) with the unsafe
   sites off and the safe ones as shipped, and with every safe one on. Safe
   sites are turned on only where that lowers the peak (each measured on its
   own); otherwise they are reported "safe, saves 0 bytes": enabling them adds
   risk for no gain. `enable_safe=True` turns them all on.
3. Proof: `verify` compares the planned configuration with the out-of-place
   program (outputs, loss, gradients, buffers, inputs, and parameters after
   optimizer steps). A site it names is turned off and the plan is redone, so
   the plan it returns is one verify accepts.

Functional `inplace=True` calls cannot be switched from outside the code:
they are decided the same way and reported with the line to change (verify
runs with the unsafe ones switched off, as if the line were changed).
"""

from __future__ import annotations

import copy
import datetime
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from ..._compat import TORCH_VERSION
from .toml_config import HEADER_TABLE, apply_config, compress, inplace_modules, toml_string
from ...errors import UsageError
from ...findings import Finding, Severity
from ..memory.ledger import MemoryReport, copy_model_and_optimizer, measure_owned, times_owned
from ...printing import fmt_bytes


@dataclass
class Decision:
    """One in-place site and what the plan does with it."""

    site: str  # module path ("layer1.0.relu"), or file:line of a functional inplace=True call
    kind: str  # "module" or "call"
    module_type: str | None
    shipped: bool
    inplace: bool  # the planned setting
    safe: bool | None  # None: the traced run never executed it
    reason: str
    saves_bytes: int | None = None  # peak reduction measured for this decision (negative: costs)
    evidence: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.inplace != self.shipped

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "kind": self.kind,
            "module_type": self.module_type,
            "shipped": self.shipped,
            "inplace": self.inplace,
            "safe": self.safe,
            "reason": self.reason,
            "saves_bytes": self.saves_bytes,
            "evidence": list(self.evidence),
        }


@dataclass
class CheckpointSuggestion:
    """What wrapping the module that holds the most saved activations in checkpointing measures."""

    module: str
    saved_bytes: int  # saved activations its subtree holds at the peak
    peak_before: int
    peak_after: int
    time_ratio: float  # step time with checkpointing / without
    caveats: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "saved_bytes": self.saved_bytes,
            "peak_before": self.peak_before,
            "peak_after": self.peak_after,
            "time_ratio": self.time_ratio,
            "caveats": list(self.caveats),
        }


@dataclass
class Plan:
    """The decisions, their evidence and the measurements before and after."""

    target: str
    mode: str
    inputs: list[str]
    optimizer: str | None
    decisions: list[Decision]
    peak_shipped: int | None  # None: the shipped configuration raises
    peak_planned: int
    time_shipped: float | None
    time_planned: float
    verified: Any  # VerifyResult of the planned configuration
    memory_shipped: MemoryReport | None
    memory_planned: MemoryReport
    shipped_error: str | None = None
    other_findings: list[Finding] = field(default_factory=list)  # not controlled by any flag
    saved_by_module: list[tuple[str, int]] = field(default_factory=list)
    checkpoint: CheckpointSuggestion | None = None
    checkpoint_declined: str | None = None  # why no module is suggested for checkpointing
    all_paths: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    # -- the config ----------------------------------------------------------
    def config(self) -> dict[str, bool]:
        """Module path -> planned `inplace` flag, for every module site the run executed."""
        return {d.site: d.inplace for d in self.decisions if d.kind == "module" and d.safe is not None}

    def memory_series(self) -> list[tuple[str, MemoryReport]]:
        """(label, report) for the charts: shipped (when it runs) and planned."""
        series = [("shipped", self.memory_shipped)] if self.memory_shipped is not None else []
        return series + [("planned", self.memory_planned)]

    def largest_holders(self, top: int = 5) -> list[tuple[str, int]]:
        """Up to `top` (module path, saved-activation bytes) from `saved_by_module`, largest first,
        no entry an ancestor or descendant of another.

        A subtree's bytes include its children's, so listing `layer1` beside `layer1.0` counts the
        same activations twice. Picked greedily: each module in order of bytes, skipped when a
        module already listed contains it or is contained by it.
        """
        return disjoint_holders(self.saved_by_module, top)

    @property
    def never_executed(self) -> list[str]:
        return [d.site for d in self.decisions if d.kind == "module" and d.safe is None]

    def apply(self, model: torch.nn.Module) -> dict[str, bool]:
        """Set `model`'s flags as planned; returns what changed (path -> new flag)."""
        return apply_config(model, self.config(), never_executed=[])

    def toml(self) -> str:
        reasons = {d.site: d for d in self.decisions}
        lines = [
            "# inplace-doctor in-place config: which modules run in place.",
            "# Keys are module paths (fnmatch globs allowed; later entries win).",
            "# Apply with inplace_doctor.apply_config(model, path) or plan.apply(model); check with",
            "# `inplace-doctor verify SPEC --config FILE` (or audit).",
            f"# Derived {datetime.date.today().isoformat()} from one traced training step; re-derive when the",
            "# model, its inputs or its mode change.",
            f"# Peak memory: shipped {_bytes_or(self.peak_shipped, self.shipped_error)}, "
            f"planned {fmt_bytes(self.peak_planned)}.",
            "",
            f"[{HEADER_TABLE}]",
            f"target = {toml_string(self.target)}",
            "inputs = [" + ", ".join(toml_string(i) for i in self.inputs) + "]",
            f"mode = {toml_string(self.mode)}",
            f"optimizer = {toml_string(self.optimizer or 'none')}",
            f"torch = {toml_string(TORCH_VERSION)}",
            *self._peak_shipped_lines(),
            f"peak-planned-bytes = {self.peak_planned}",
            f"verified = {'true' if bool(self.verified) else 'false'}",
            "never-executed = [" + ", ".join(toml_string(p) for p in self.never_executed) + "]",
            "",
            "[inplace]",
        ]
        for pattern, flag, members in compress(self.config(), self.all_paths):
            d = reasons[members[0]]
            note = d.reason if len(members) == 1 else f"{len(members)} modules: {d.reason}"
            lines.append(f"{toml_string(pattern)} = {'true' if flag else 'false'}  # {note}")
        calls = [d for d in self.decisions if d.kind == "call"]
        if calls:
            lines.append("")
            lines.append("# Functional inplace=True calls (change the line itself):")
            for d in calls:
                lines.append(f"#   {d.site}: {'keep' if d.inplace else 'change to inplace=False'} ({d.reason})")
        return "\n".join(lines) + "\n"

    def _peak_shipped_lines(self) -> list[str]:
        """The header's measured shipped peak; when the shipped configuration raised there is no
        measurement, so the key is left out (never a sentinel) and a comment says why."""
        if self.peak_shipped is not None:
            return [f"peak-shipped-bytes = {self.peak_shipped}"]
        return [f"# peak-shipped-bytes: not measured, the shipped configuration raises ({self.shipped_error})"]

    def write(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.toml())

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "inputs": list(self.inputs),
            "optimizer": self.optimizer,
            "decisions": [d.to_dict() for d in self.decisions],
            "peak_shipped": self.peak_shipped,
            "peak_planned": self.peak_planned,
            "time_shipped": self.time_shipped,
            "time_planned": self.time_planned,
            "verified": bool(self.verified),
            "shipped_error": self.shipped_error,
            "other_findings": [f.to_dict() for f in self.other_findings],
            "saved_by_module": [list(x) for x in self.saved_by_module],
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "checkpoint_declined": self.checkpoint_declined,
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        from ...render.plan_text import plan_to_plain_text

        return plan_to_plain_text(self)


def _bytes_or(n: int | None, error: str | None) -> str:
    return fmt_bytes(n) if n is not None else f"raises ({error})"


# -- building the plan -------------------------------------------------------------


def _configured(model: torch.nn.Module, flags: Mapping[str, bool], optimizer: Any = None) -> tuple[torch.nn.Module, Any]:
    """A copy of `model` with `flags` set, and a copy of `optimizer` over it (None stays None)."""
    copy_, opt = copy_model_and_optimizer(model, optimizer)
    modules = inplace_modules(copy_)
    for path, flag in flags.items():
        setattr(modules[path], "inplace", flag)
    return copy_, opt


def _site_of_call(f: Finding) -> str | None:
    return f"{f.mutation.file}:{f.mutation.line}" if f.mutation.file else None


def _executed(model: torch.nn.Module, args: Any, kwargs: Any, loss_fn: Any) -> tuple[set[str], list[str]]:
    """On a copy: the inplace-capable modules one step executes, and the
    functional `inplace=True` calls it makes (file:line)."""
    from ..verify.equivalence import _Functional
    from ..memory.ledger import training_step

    copy_ = copy.deepcopy(model)
    seen: set[str] = set()
    handles = [
        m.register_forward_pre_hook(lambda mod, inp, name=name: seen.add(name))
        for name, m in inplace_modules(copy_).items()
    ]
    calls = _Functional(set())
    try:
        with calls:
            training_step(copy_, copy.deepcopy(args), copy.deepcopy(kwargs), loss_fn, None)
    except RuntimeError:
        pass  # the shipped configuration may break backward: forward already ran
    finally:
        for h in handles:
            h.remove()
    return seen, list(calls.seen)


def _describe(f: Finding) -> str:
    where = f" at {f.mutation.location}" if f.mutation.file else ""
    slot = f" ({f.details['slot']})" if f.details.get("slot") else ""
    return f"{f.code} {f.title}{slot}{where}"


def optimize(
    model: torch.nn.Module,
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    optimizer: Any = None,
    enable_safe: bool = False,
    suggest_checkpoint: bool = True,
    checkpoint_min_share: float | None = None,
    steps: int = 2,
    input_specs: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> Plan:
    """Decide every in-place site of `model` from evidence; the model itself is not changed.

    Args:
        model: the model as shipped, in the mode to plan for (train or eval).
        *args, **kwargs: its inputs.
        loss_fn: output -> scalar loss; default: the sum of floating outputs.
        optimizer: an optimizer over `model`'s parameters, or `params -> optimizer`;
            its step is part of the measured peak and of the verification.
        enable_safe: turn on every safe site, not only those that lower the peak.
        suggest_checkpoint: also measure checkpointing the module that holds
            the most saved activations; it is suggested only when it lowers the
            peak by at least `CHECKPOINT_MIN_SHARE` (5%) of it, otherwise
            `plan.checkpoint_declined` says why in one line.
        checkpoint_min_share: that threshold as a share of the peak (default
            `CHECKPOINT_MIN_SHARE`); 0 measures and reports the largest holder
            whatever it saves (benchmarks/memory.py does, for its table).
        steps: training steps per memory measurement (the last is reported).
        input_specs: how to name the inputs in the config header (the CLI's `--input`).
        progress: called with a short description of each stage.
    """
    from ..audit import audit
    from ..verify.equivalence import ATOL, RTOL, _verify
    from ..preserve import RngState, tensors_in

    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"optimize() needs a torch.nn.Module, got {type(model).__name__}")
    say = progress or (lambda stage: None)
    rng = RngState()
    try:
        modules = inplace_modules(model)
        shipped = {path: bool(m.inplace) for path, m in modules.items()}
        say("tracing which modules run")
        executed, call_sites = _executed(model, args, kwargs, loss_fn)
        rng.restore()

        def measure(flags: Mapping[str, bool]) -> MemoryReport:
            rng.restore()
            copy_, opt = _configured(model, flags, optimizer)
            return measure_owned(copy_, opt, args, kwargs, loss_fn=loss_fn, steps=steps, target=model)

        unsafe: dict[str, list[str]] = {}  # module path -> evidence
        unsafe_calls: dict[str, list[str]] = {}  # file:line -> evidence
        other: list[Finding] = []
        plan_flags: dict[str, bool] = {}
        verified: Any = None
        for attempt in range(len(modules) + 8):
            other = []
            # 1. Unsafe sites: audit with every executed flag on, until no finding names a flag.
            for round_ in range(len(executed) + 2):
                say(f"auditing with {len(executed) - len(unsafe)} flags on (round {round_ + 1})")
                flags = {p: (p not in unsafe) for p in executed}
                rng.restore()
                report = audit(_configured(model, flags)[0], *args, loss_fn=loss_fn, **kwargs)
                new = False
                other = []
                for f in report.findings:
                    if f.severity not in (Severity.ERROR, Severity.WARNING):
                        continue
                    path = f.mutation.module
                    if path is not None and flags.get(path):
                        unsafe.setdefault(path, []).append(_describe(f))
                        new = True
                    elif _site_of_call(f) in call_sites:
                        unsafe_calls.setdefault(_site_of_call(f) or "", []).append(_describe(f))
                    else:
                        other.append(f)
                if not new:
                    break
            # 2. Effect of the safe sites on the peak.
            safe = [p for p in executed if p not in unsafe]
            base = {p: (False if p in unsafe else shipped[p]) for p in executed}
            say("measuring memory with the unsafe sites off")
            mem_base = measure(base)
            savings: dict[str, int] = {}
            off_safe = [p for p in safe if not base[p]]
            if off_safe:
                say(f"measuring memory with all {len(safe)} safe sites on")
                mem_all = measure({**base, **{p: True for p in safe}})
                group_saving = mem_base.peak - mem_all.peak
                if enable_safe:
                    plan_flags = {**base, **{p: True for p in safe}}
                    for p in off_safe:
                        savings[p] = group_saving
                elif group_saving > 0:
                    plan_flags = dict(base)
                    for i, p in enumerate(off_safe):
                        say(f"measuring safe site {i + 1}/{len(off_safe)}: {p}")
                        saving = mem_base.peak - measure({**base, p: True}).peak
                        savings[p] = saving
                        if saving > 0:
                            plan_flags[p] = True
                else:
                    plan_flags = dict(base)
                    for p in off_safe:
                        savings[p] = 0
            else:
                plan_flags = dict(base)
            # 3. Proof.
            say("verifying the planned configuration against the out-of-place program")
            rng.restore()
            verified = _verify(
                model, args, kwargs, loss_fn=loss_fn, steps=max(1, steps), optimizer=optimizer,
                atol=ATOL, rtol=RTOL, localize=True, inplace_calls_off=set(unsafe_calls), flags=plan_flags,
            )
            if verified.equivalent:
                break
            culprits = [c for c in verified.culprits if c.kind == "module" and plan_flags.get(c.where)]
            culprit_calls = [c for c in verified.culprits if c.kind == "call" and c.where not in unsafe_calls]
            if not culprits and not culprit_calls:
                break  # nothing left to switch off: reported as not verified
            for c in culprits:
                unsafe.setdefault(c.where, []).append(f"verify: {verified.first_difference}")
            for c in culprit_calls:
                unsafe_calls.setdefault(c.where, []).append(f"verify: {verified.first_difference}")
        say("measuring the planned and shipped configurations")
        mem_planned = measure(plan_flags)
        safe_on = [p for p in executed if p not in unsafe and plan_flags[p] and p not in savings]
        if safe_on:
            say(f"measuring the {len(safe_on)} safe sites kept on, switched off together")
            group = measure({**plan_flags, **{p: False for p in safe_on}}).peak - mem_planned.peak
            for p in safe_on:
                savings[p] = group
            kept_as_group = set(safe_on)
        else:
            kept_as_group = set()
        mem_shipped: MemoryReport | None = None
        shipped_error = None
        try:
            mem_shipped = measure(shipped)
        except RuntimeError as e:
            shipped_error = textwrap.shorten(str(e).splitlines()[0], 400, placeholder=" ...")
        rng.restore()
        time_shipped: float | None = None
        # plan_flags covers the executed modules only; the others stay as shipped.
        changes_flags = any(flag != shipped[path] for path, flag in plan_flags.items())
        if mem_shipped is not None and changes_flags:
            time_planned, time_shipped = times_owned(
                [_configured(model, plan_flags, optimizer), _configured(model, shipped, optimizer)], args, kwargs,
                loss_fn=loss_fn,
            )
        else:  # one configuration to time: the plan changes no flag, or the shipped one raises
            (time_planned,) = times_owned([_configured(model, plan_flags, optimizer)], args, kwargs, loss_fn=loss_fn)
            if mem_shipped is not None:
                time_shipped = time_planned

        decisions = _decisions(
            modules, shipped, executed, unsafe, plan_flags, savings, kept_as_group, mem_base.peak, mem_shipped
        )
        for call in call_sites:
            evidence = unsafe_calls.get(call, [])
            decisions.append(
                Decision(
                    site=call, kind="call", module_type=None, shipped=True, inplace=not evidence,
                    safe=not evidence,
                    reason=("unsafe: " + evidence[0]) if evidence else "safe: no finding names this call",
                    evidence=evidence,
                )
            )
        plan = Plan(
            target=type(model).__name__,
            mode="train" if model.training else "eval",
            inputs=input_specs or [_spec(t) for t in tensors_in((args, kwargs))],
            optimizer=mem_planned.optimizer,
            decisions=decisions,
            peak_shipped=mem_shipped.peak if mem_shipped is not None else None,
            peak_planned=mem_planned.peak,
            time_shipped=time_shipped,
            time_planned=time_planned,
            verified=verified,
            memory_shipped=mem_shipped,
            memory_planned=mem_planned,
            shipped_error=shipped_error,
            other_findings=other,
            saved_by_module=_saved_by_module(mem_planned),
            all_paths=list(modules),
        )
        if not modules:
            plan.notes.append("no module has an `inplace` option")
        if suggest_checkpoint:
            say("measuring activation checkpointing of the largest holder")
            share = CHECKPOINT_MIN_SHARE if checkpoint_min_share is None else checkpoint_min_share
            plan.checkpoint = _checkpoint_suggestion(
                model, plan_flags, plan, args, kwargs, loss_fn, optimizer, steps, rng, share
            )
        return plan
    finally:
        rng.restore()


def _decisions(
    modules: dict[str, torch.nn.Module],
    shipped: dict[str, bool],
    executed: set[str],
    unsafe: dict[str, list[str]],
    plan_flags: dict[str, bool],
    savings: dict[str, int],
    kept_as_group: set[str],
    base_peak: int,
    mem_shipped: MemoryReport | None,
) -> list[Decision]:
    out = []
    for path, module in modules.items():
        kind = type(module).__name__
        if path not in executed:
            out.append(Decision(path, "module", kind, shipped[path], shipped[path], None,
                                "not executed by the traced run: left as shipped"))
            continue
        flag = plan_flags[path]
        if path in unsafe:
            evidence = unsafe[path]
            effect = (mem_shipped.peak - base_peak) if (mem_shipped is not None and shipped[path]) else None
            reason = "unsafe: " + evidence[0]
            if shipped[path]:
                if mem_shipped is None:
                    reason += "; switching it off is what lets the step run"
                else:
                    n = sum(1 for p in unsafe if shipped.get(p))
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
        else:
            out.append(Decision(path, "module", kind, shipped[path], flag, True, "safe: kept as shipped"))
    return out


def _spec(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) + ":" + str(t.dtype).removeprefix("torch.")


def _saved_by_module(report: MemoryReport) -> list[tuple[str, int]]:
    """Saved-activation bytes at the forward peak per module subtree, largest first (root excluded)."""
    totals: dict[str, int] = {}
    for module, nbytes in report.saved_by_module("forward" if "forward" in report.peaks else None):
        parts = module.split(".")[1:]  # drop "model"; the root's own saves belong to no subtree
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            totals[key] = totals.get(key, 0) + nbytes
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))


def _is_within(path: str, other: str) -> bool:
    """Whether module `path` is `other` or inside it (`layer1.0` is within `layer1`, not `layer10`)."""
    return path == other or path.startswith(other + ".")


def disjoint_holders(saved_by_module: list[tuple[str, int]], top: int = 5) -> list[tuple[str, int]]:
    """Up to `top` entries of `saved_by_module` (largest first), no entry an ancestor or
    descendant of another: picked greedily in order, skipping a module that contains, or is
    contained by, one already picked, so that no activation is counted twice."""
    picked: list[tuple[str, int]] = []
    for name, nbytes in saved_by_module:
        if len(picked) == top:
            break
        if any(_is_within(name, p) or _is_within(p, name) for p, _ in picked):
            continue
        picked.append((name, nbytes))
    return picked


# Checkpointing is suggested only where it lowers the peak by at least this share of it. Below
# that the saving is noise next to what parameters, gradients and optimizer state hold (resnet18
# at 2x3x64x64: layer1's 112 KiB of 136 MiB, 0.08%), while the recompute costs step time and
# brings caveats (BatchNorm statistics updated twice, IPD108).
CHECKPOINT_MIN_SHARE = 0.05


def _checkpoint_candidate(saved_by_module: list[tuple[str, int]]) -> tuple[str, int]:
    """The largest holder of saved activations that holds at most half of them.

    Checkpointing a module frees its activations between forward and its
    backward, but recomputes them all at once there: wrapping a module that
    holds nearly everything (`features`, the whole encoder) moves the peak
    instead of lowering it. Half leaves the rest of the network's activations
    to be freed while this one recomputes.
    """
    top_level = sum(n for name, n in saved_by_module if "." not in name)
    for name, n in saved_by_module:
        if n * 2 <= top_level:
            return name, n
    return saved_by_module[0]


def _runs_in_place(model: torch.nn.Module, path: str, flags: Mapping[str, bool]) -> bool:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return False
    return bool(flags.get(path, getattr(module, "inplace", False) is True))


def _checkpoint_suggestion(
    model: torch.nn.Module,
    flags: Mapping[str, bool],
    plan: Plan,
    args: Any,
    kwargs: Any,
    loss_fn: Any,
    optimizer: Any,
    steps: int,
    rng: Any,
    min_share: float,
) -> CheckpointSuggestion | None:
    import torch.utils.checkpoint as cp

    # A module that writes its own input in place cannot be checkpointed (the recompute writes
    # the saved input again, and backward raises), and would free nothing if it could.
    holders = [(n, b) for n, b in plan.saved_by_module if not _runs_in_place(model, n, flags)]
    peak = plan.peak_planned
    threshold = f"suggested from {min_share:.0%} of the peak"
    declined = "no single module holds enough saved activations for checkpointing to lower the peak meaningfully"
    if not holders:
        plan.checkpoint_declined = f"{declined} (no module that runs out of place holds any at the end of forward)"
        return None
    name, saved = _checkpoint_candidate(holders)
    # Checkpointing frees at most what the module holds: below the threshold it is not worth measuring.
    if saved < min_share * peak or saved == 0:
        plan.checkpoint_declined = (
            f"{declined} (the best candidate, {name}, holds {fmt_bytes(saved)}, "
            f"{_share(saved, peak)} of the {fmt_bytes(peak)} peak; {threshold})"
        )
        return None
    # Measured and timed on this one copy: a deep copy of it would copy the function below as
    # it is, still calling this copy's module.
    wrapped, opt = _configured(model, flags, optimizer)
    target = wrapped.get_submodule(name)
    forward = target.forward

    def checkpointed(*a: Any, **k: Any) -> Any:
        return cp.checkpoint(forward, *a, use_reentrant=False, **k)

    target.forward = checkpointed  # type: ignore[method-assign]
    rng.restore()
    try:
        after = measure_owned(wrapped, opt, args, kwargs, loss_fn=loss_fn, steps=steps, target=model)
    except Exception as e:  # a module that cannot be checkpointed (non-tensor outputs, ...)
        plan.notes.append(textwrap.shorten(f"checkpointing {name} could not be measured: {type(e).__name__}: {e}", 400, placeholder=" ..."))
        return None
    rng.restore()
    (t_after,) = times_owned([(wrapped, opt)], args, kwargs, loss_fn=loss_fn)
    lowered = peak - after.peak
    if min_share > 0 and lowered < min_share * peak:
        if lowered > 0:
            effect = f"lowers the {fmt_bytes(peak)} peak by only {fmt_bytes(lowered)}, {_share(lowered, peak)}"
        elif lowered == 0:
            effect = f"leaves the {fmt_bytes(peak)} peak unchanged"
        else:
            effect = f"raises the {fmt_bytes(peak)} peak to {fmt_bytes(after.peak)}"
        plan.checkpoint_declined = (
            f"{declined} (measured: checkpointing {name}, which holds {fmt_bytes(saved)}, {effect}; {threshold})"
        )
        return None
    caveats = []
    if model.training and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in target.modules()):
        caveats.append("contains BatchNorm: its running statistics update again on recompute (IPD108)")
    return CheckpointSuggestion(
        module=name,
        saved_bytes=saved,
        peak_before=plan.peak_planned,
        peak_after=after.peak,
        time_ratio=t_after / plan.time_planned if plan.time_planned > 0 else float("nan"),
        caveats=caveats,
    )


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole > 0 else "n/a"
