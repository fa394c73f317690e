"""The rule catalogue: one rule, one code, its docstring is its documentation.

Codes: `IPD` + three digits, families by hundreds (1xx: in-place hazards to
autograd and program meaning). Codes are never reused or renumbered.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..causes import Cause, Facts, SiteRole
from ..errors import UsageError
from ..events import SavedTensorOverwritten
from ..findings import Finding, Fix, FixKind, Severity
from ..sites import Site


class RuleContext(Protocol):
    """What a rule may ask of the session besides its event: three questions, all typed.

    A rule never sees another rule's findings: `earlier` answers only with the asking rule's own.
    """

    @property
    def root_label(self) -> str:
        """What reports call the model (`model`), or "" when modules are named by path alone."""
        ...

    def overwrite_for(self, key: int) -> SavedTensorOverwritten | None:
        """The last write that changed saved tensor `key`, if one was seen."""
        ...

    def earlier(self, cause: Cause) -> Finding | None:
        """This rule's last finding with `cause`, if it made one (an error confirming it)."""
        ...


#: a rule: its event (of the types it registered for) and the context, to a finding or None
Check = Callable[..., Finding | None]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    title: str
    severity: Severity
    events: tuple[type, ...]
    check: Check
    #: the fast tracer (the default, `engines/tracer_mode.py`) gives this rule the same findings as the
    #: deep one; a rule that needs every op through a dispatch mode says `fast=False` where it is written
    fast: bool = True

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.check.__doc__ or "")

    @property
    def summary(self) -> str:
        return self.doc.splitlines()[0] if self.doc else self.title


RULES: dict[str, Rule] = {}


def rule(
    code: str, name: str, title: str, severity: Severity, events: Iterable[type], *, fast: bool = True
) -> Callable[[Check], Check]:
    """Register the decorated check as rule `code`: everything the rule needs is said here (its
    events; `fast=False` if the fast tracer cannot serve it), nothing elsewhere."""

    def register(check: Check) -> Check:
        if code in RULES:
            raise ValueError(f"rule code {code} registered twice")
        RULES[code] = Rule(code, name, title, severity, tuple(events), check, fast)
        return check

    return register


def make_finding(
    code: str, *, cause: Cause, mutation: Site, root_label: str, saved: Site | None = None,
    read: Site | None = None, read_role: SiteRole = SiteRole.READ, confirmed: bool | None = None,
    severity: Severity | None = None, facts: Facts | None = None, slot: str | None = None,
    target: str | None = None, fixes: tuple[Fix, ...] = (),
) -> Finding:
    """A finding of rule `code`, its decision as fields (`cause`, `facts`, sites; `fixes` the fix as
    records, `rules/fixes/fix_builders.py`), for a model called `root_label` in reports. No sentence is made
    here: the explainer render/explain/ registered for (`code`, `cause`) makes them when asked."""
    registered = RULES[code]
    finding = Finding(
        code=code,
        severity=severity or registered.severity,
        title=registered.title,
        mutation=mutation,
        saved=saved,
        confirmed=confirmed,
        read=read,
        cause=cause,
        facts=facts,
        slot=slot,
        target=target,
        read_role=read_role,
        fixes=fixes,
        root_label=root_label,
    )
    if not finding.fixes:  # every fix a report prints is a record: this one has no edit
        finding = finding.with_(fixes=(Fix(FixKind.OTHER),))
    return finding


def _match(pattern: str) -> list[str]:
    pattern = pattern.strip().upper()
    return [code for code in RULES if code.startswith(pattern)]


def select_rules(select: Iterable[str] | str | None = None, ignore: Iterable[str] | str | None = None) -> list[Rule]:
    """Rules chosen by code or prefix, ruff-style (`IPD1`, `IPD101`); unknown codes are a UsageError."""

    def patterns(value: Iterable[str] | str | None) -> list[str]:
        if value is None:
            return []
        items = value.split(",") if isinstance(value, str) else list(value)
        out: list[str] = []
        for item in items:
            out.extend(p for p in str(item).split(",") if p.strip())
        return out

    chosen = set(RULES) if not select else set()
    for pattern in patterns(select):
        matched = _match(pattern)
        if not matched:
            raise UsageError(unknown_rule_message(pattern))
        chosen.update(matched)
    for pattern in patterns(ignore):
        matched = _match(pattern)
        if not matched:
            raise UsageError(unknown_rule_message(pattern))
        chosen.difference_update(matched)
    return [RULES[c] for c in sorted(chosen)]


def unknown_rule_message(pattern: str) -> str:
    close = difflib.get_close_matches(pattern.strip().upper(), list(RULES), n=1)
    hint = f"did you mean {close[0]}?" if close else f"known rules: {', '.join(sorted(RULES))}"
    return f"unknown rule code or prefix {pattern.strip()!r}; {hint}"


def get_rule(code: str) -> Rule:
    found = RULES.get(code.strip().upper())
    if found is None:
        raise UsageError(unknown_rule_message(code))
    return found


def fast_mode_rules() -> frozenset[str]:
    """Codes of the rules the fast tracer serves (each rule says so in its `@rule`); the rule
    fixtures run under both tracers for these."""
    return frozenset(code for code, r in RULES.items() if r.fast)


def needing_deep_mode(rules: Iterable[Rule]) -> list[str]:
    """Codes of the chosen rules the fast tracer does not serve: their choice turns deep mode on."""
    return sorted(r.code for r in rules if not r.fast)
