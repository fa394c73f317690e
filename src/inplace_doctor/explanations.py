"""The one seam between a rule's decision and its English: explainers keyed by rule and cause.

A rule decides: it picks a `cause`, fills its `facts` record and its sites, and calls
`rules.registry.make_finding`, which builds a record and no sentence. The English is made
when asked (`Finding.what`, `.why`, `.fix`, `.message`, and every renderer), by the
explainer render/explain/ registered for the finding's (rule code, cause) with
`@explains("IPD102", LeafCause.LEAF)`: one copy of each verdict, its words derived from it,
as ruff derives a violation's message from its fields. The package's `__init__` imports
render/, which registers every explainer; this module imports no record, so `findings.py`
can ask it without a cycle.

Explainers quote the user's source lines as the finding's sites recorded them (`Site.code`)
or as `linecache` holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from .causes import Cause, Unreached


class Sentences(NamedTuple):
    """A finding's three sentences: what happened, why it matters, the fix."""

    what: str
    why: str
    fix: str


#: an explainer: the finding (its cause, facts, sites, fixes, `root_label`) to its sentences
Explainer = Callable[[Any, str], Sentences]

E = TypeVar("E", bound=Explainer)

_EXPLAINERS: dict[tuple[str, Cause], Explainer] = {}
_UNREACHED: dict[Unreached, str] = {}


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


def explain(finding: Any) -> Sentences:
    """The sentences of `finding` (a `Finding`: its `code`, `cause` and `root_label` say which
    explainer and what the model is called)."""
    code, cause = finding.code, finding.cause
    if cause is None:
        raise LookupError(f"{code}: a finding without a cause has no explanation")
    explainer = _EXPLAINERS.get((code, cause))
    if explainer is None:
        raise LookupError(
            f"no explanation is registered for {code} {cause!r}: import inplace_doctor "
            "(its render/explain/ registers them)"
        )
    return explainer(finding, finding.root_label)


def says_unreached(words: dict[Unreached, str]) -> None:
    """Register the sentence of each `Unreached` reason (render/explain/unreached.py)."""
    _UNREACHED.update(words)


def unreached_sentence(reason: Unreached) -> str:
    """Why a prediction ended unconfirmed, in words."""
    return _UNREACHED[reason]
