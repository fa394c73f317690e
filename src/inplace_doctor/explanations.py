"""The one seam between a rule's decision and its English (records): explainers keyed by rule and cause.

A rule decides: it picks a `cause`, fills its `facts` record and its sites, and calls
`rules.registry.make_finding`, which asks this registry for the sentences. The explainers live
in `render/explain/` (one function per rule and cause, registered with `@explains("IPD102",
LeafCause.LEAF)`); the package's `__init__` imports `render/`, so by the time any rule runs
every explainer is registered. Rules import this module, never render/, as results do
`printing.renders_text`.

The sentences are made once, when the finding is made: they quote the user's source lines
(read through `linecache`) as they were when the program ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple, TypeVar

from .causes import Cause, Unreached
from .findings import Finding


class Sentences(NamedTuple):
    """A finding's three sentences: what happened, why it matters, the fix."""

    what: str
    why: str
    fix: str


#: an explainer: the finding's records (cause, facts, sites, fixes) and what reports call the model
Explainer = Callable[[Finding, str], Sentences]

E = TypeVar("E", bound=Explainer)

_EXPLAINERS: dict[tuple[str, Cause], Explainer] = {}


def explains(code: str, *causes: Cause) -> Callable[[E], E]:
    """Register the decorated function as the sentences of rule `code`'s findings with one of `causes`."""

    def register(fn: E) -> E:
        for cause in causes:
            if (code, cause) in _EXPLAINERS:
                raise ValueError(f"{code} {cause!r} explained twice")
            _EXPLAINERS[(code, cause)] = fn
        return fn

    return register


def explained_pairs() -> frozenset[tuple[str, Cause]]:
    """Every (rule code, cause) an explainer is registered for."""
    return frozenset(_EXPLAINERS)


def explain(finding: Finding, root_label: str) -> Sentences:
    """The sentences of `finding`, from the explainer registered for its rule and cause."""
    if finding.cause is None:
        raise LookupError(f"{finding.code}: a finding without a cause has no explanation")
    explainer = _EXPLAINERS.get((finding.code, finding.cause))
    if explainer is None:
        raise LookupError(
            f"no explanation is registered for {finding.code} {finding.cause!r}: import inplace_doctor "
            "(its render/explain/ registers them)"
        )
    return explainer(finding, root_label)


def explained(finding: Finding, root_label: str) -> Finding:
    """`finding` with its sentences (`what`, `why`, `fix`) made from its records."""
    what, why, fix = explain(finding, root_label)
    return replace(finding, what=what, why=why, fix=fix)


_UNREACHED: dict[Unreached, str] = {}


def says_unreached(words: dict[Unreached, str]) -> None:
    """Register the sentence of each `Unreached` reason (render/explain/unreached.py)."""
    _UNREACHED.update(words)


def unreached(finding: Finding, reason: Unreached) -> Finding:
    """`finding`, unconfirmed for `reason`: the reason as a field, and its sentence."""
    return replace(finding, confirmed=False, unreached=reason, unconfirmed_reason=_UNREACHED[reason])
