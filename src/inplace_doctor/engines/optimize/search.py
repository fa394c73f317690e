"""The search for a configuration: optimize's rounds of audit (unsafe sites), memory (what the
safe ones save) and verify (proof), each a method of `Search`; see decide.py for the method."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ...findings import Finding, Severity
from ..audit import audit
from ..memory import MemoryReport, measure_owned, times_owned
from ..preserve import RngState, private_copies
from ..training import LossFn, copy_for_training, training_step
from ..verify import ATOL, RTOL, FunctionalInplace, VerifyResult, verify_configuration
from .toml_config import inplace_modules


@dataclass
class Decided:
    """Where the search for a configuration ended: the last round's flags, evidence and proof."""

    plan_flags: dict[str, bool]  # executed module path -> planned flag
    verified: VerifyResult
    base_peak: int  # the peak with the unsafe sites off and the safe ones as shipped
    savings: dict[str, int]  # module path -> peak reduction measured for switching it on
    other: list[Finding]  # findings no flag controls


@dataclass(eq=False)
class Search:
    """One `optimize()` call: the model as shipped, how to run it, and the evidence gathered.

    `unsafe` and `unsafe_calls` (site -> evidence) only grow: a site found unsafe by an audit
    or named by verify stays off in every later round.
    """

    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    loss_fn: LossFn | None
    optimizer: Any
    steps: int
    say: Callable[[str], None]
    rng: RngState = field(default_factory=RngState)
    unsafe: dict[str, list[str]] = field(default_factory=dict)  # module path -> evidence
    unsafe_calls: dict[str, list[str]] = field(default_factory=dict)  # file:line -> evidence
    executed: set[str] = field(default_factory=set)  # inplace-capable modules one step runs
    call_sites: list[str] = field(default_factory=list)  # functional inplace=True calls (file:line)
    # call -> the module sites whose flag a finding at that call was charged to (`inplace=self.inplace`)
    calls_under_flags: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.modules = inplace_modules(self.model)
        self.shipped = {path: bool(m.inplace) for path, m in self.modules.items()}
        # A forward (pre-)hook is handed the module's input, which in place the module overwrites:
        # what the hook keeps of it may be read after forward, where no audit or verify run sees it.
        self.hooked = {path for path, m in self.modules.items() if m._forward_hooks or m._forward_pre_hooks}

    def configured(self, flags: Mapping[str, bool]) -> tuple[torch.nn.Module, Any]:
        """A copy of the model with `flags` set, and a copy of the optimizer over it."""
        return copy_for_training(self.model, self.optimizer, flags=flags)

    def measure(self, flags: Mapping[str, bool]) -> MemoryReport:
        """`ipd.memory` of the model with `flags` set, from the call's RNG state."""
        self.rng.restore()
        copy_, opt = self.configured(flags)
        return measure_owned(copy_, opt, self.args, self.kwargs, loss_fn=self.loss_fn, steps=self.steps, target=self.model)

    def times(self, *configurations: Mapping[str, bool]) -> list[float]:
        """Seconds of one training step of the model with each of `configurations` set."""
        owned = [self.configured(flags) for flags in configurations]
        return times_owned(owned, self.args, self.kwargs, loss_fn=self.loss_fn)

    def trace_sites(self) -> None:
        """On a copy: the inplace-capable modules one step executes, and the functional
        `inplace=True` calls it makes (file:line)."""
        self.say("tracing which modules run")
        copy_, _ = copy_for_training(self.model)
        seen: set[str] = set()
        calls = FunctionalInplace(set())
        try:
            with calls, _noting_calls(copy_, seen):
                for _ in range(max(1, self.steps)):  # as many as verify runs: a forward may change after its first call
                    training_step(copy_, *private_copies(self.args, self.kwargs), self.loss_fn, None)
        except RuntimeError:
            pass  # the shipped configuration may break backward (forward already ran), or forward: see find_unsafe
        self.executed, self.call_sites = seen, list(calls.seen)
        self.rng.restore()

    def decide(self, enable_safe: bool) -> Decided:
        """Rounds of: find the unsafe sites, measure the safe ones, prove the result; until verify
        accepts it or names nothing left to switch off."""
        for _ in range(len(self.modules) + 8):
            other = self.find_unsafe()
            base_peak, savings, plan_flags = self.effects(enable_safe)
            verified = self.prove(plan_flags)
            if not self.blame(verified, plan_flags):
                break
        return Decided(plan_flags, verified, base_peak, savings, other)

    def find_unsafe(self) -> list[Finding]:
        """1. Audit with every executed flag on (the unsafe ones off), until no finding names a
        flag; returns the findings that name no site."""
        other: list[Finding] = []
        for round_ in range(len(self.modules) + 2):
            self.say(f"auditing with {len(self.executed) - len(self.unsafe)} flags on (round {round_ + 1})")
            flags = {p: (p not in self.unsafe) for p in self.executed}
            self.rng.restore()
            args, kwargs = private_copies(self.args, self.kwargs)  # audit of the caller's would write them, and their versions move
            copy_ = copy_for_training(self.model, flags=flags)[0]
            # A forward that raised in an earlier round (an unsafe site's write) ran only up to
            # there: the modules it reaches now are sites too, audited from the next round.
            ran: set[str] = set()
            with _noting_calls(copy_, ran):
                report = audit(copy_, *args, loss_fn=self.loss_fn, **kwargs)
            new = bool(ran - self.executed)
            self.executed |= ran
            other = []
            for f in report.findings:
                if f.severity not in (Severity.ERROR, Severity.WARNING):
                    continue
                path = f.mutation.module
                if path is not None and flags.get(path, path in ran and self.shipped.get(path)):
                    self.unsafe.setdefault(path, []).append(_describe(f))
                    if _site_of_call(f) in self.call_sites:
                        self.calls_under_flags.setdefault(_site_of_call(f) or "", set()).add(path)
                    new = True
                elif _site_of_call(f) in self.call_sites:
                    self.unsafe_calls.setdefault(_site_of_call(f) or "", []).append(_describe(f))
                else:
                    other.append(f)
            if not new:
                break
        return other

    def effects(self, enable_safe: bool) -> tuple[int, dict[str, int], dict[str, bool]]:
        """2. The peak with the unsafe sites off, the savings of the safe ones switched on, and
        the flags that follow: (base peak, savings, planned flags)."""
        safe = [p for p in self.executed if p not in self.unsafe]
        base = {p: (False if p in self.unsafe else self.shipped[p]) for p in self.executed}
        self.say("measuring memory with the unsafe sites off")
        base_peak = self.measure(base).peak
        savings: dict[str, int] = {}
        off_safe = [p for p in safe if not base[p] and p not in self.hooked]  # hooked ones: left off
        if not off_safe:
            return base_peak, savings, dict(base)
        self.say(f"measuring memory with the {len(off_safe)} safe sites shipped off switched on")
        group_saving = base_peak - self.measure({**base, **{p: True for p in off_safe}}).peak
        if enable_safe:
            for p in off_safe:
                savings[p] = group_saving
            return base_peak, savings, {**base, **{p: True for p in off_safe}}
        plan_flags = dict(base)
        if group_saving > 0:
            for i, p in enumerate(off_safe):
                self.say(f"measuring safe site {i + 1}/{len(off_safe)}: {p}")
                saving = base_peak - self.measure({**base, p: True}).peak
                savings[p] = saving
                if saving > 0:
                    plan_flags[p] = True
        else:
            for p in off_safe:
                savings[p] = 0
        return base_peak, savings, plan_flags

    def prove(self, plan_flags: dict[str, bool]) -> VerifyResult:
        """3. Verify the planned configuration against the out-of-place program."""
        self.say("verifying the planned configuration against the out-of-place program")
        self.rng.restore()
        return verify_configuration(
            self.model, self.args, self.kwargs, loss_fn=self.loss_fn, steps=max(1, self.steps),
            optimizer=self.optimizer, atol=ATOL, rtol=RTOL, localize=True,
            inplace_calls_off=set(self.unsafe_calls), flags=plan_flags,
        )

    def blame(self, verified: VerifyResult, plan_flags: dict[str, bool]) -> bool:
        """Mark the sites verify names as unsafe; whether there were any (then search again)."""
        if verified.equivalent:
            return False
        # A module no traced run reached that verify names ran as shipped there: a site too.
        culprits = [c for c in verified.culprits if c.kind == "module"
                    and plan_flags.get(c.where, c.where not in plan_flags and self.shipped.get(c.where))]
        culprit_calls = [c for c in verified.culprits if c.kind == "call" and c.where not in self.unsafe_calls]
        if not culprits and not culprit_calls:
            return False  # nothing left to switch off: reported as not verified
        for c in culprits:
            self.unsafe.setdefault(c.where, []).append(f"verify: {verified.first_difference}")
            self.executed.add(c.where)
        for c in culprit_calls:
            self.unsafe_calls.setdefault(c.where, []).append(f"verify: {verified.first_difference}")
        return True


@contextlib.contextmanager
def _noting_calls(model: torch.nn.Module, seen: set[str]) -> Iterator[None]:
    """Adds to `seen` the path of each module of `model` with an `inplace` option as it is called."""
    handles = [
        m.register_forward_pre_hook(lambda mod, inp, name=name: seen.add(name))
        for name, m in inplace_modules(model).items()
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _site_of_call(f: Finding) -> str | None:
    return f"{f.mutation.file}:{f.mutation.line}" if f.mutation.file else None


def _describe(f: Finding) -> str:
    where = f" at {f.mutation.location}" if f.mutation.file else ""
    slot = f" ({f.slot})" if f.slot else ""
    return f"{f.code} {f.title}{slot}{where}"
