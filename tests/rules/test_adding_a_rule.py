"""A new rule goes in one place (issue 39): the recipe of docs/architecture.md ("Adding a rule"),
followed here with a dummy rule, runs under both tracers; what must be registered besides is
checked, and the failure says which line to add."""

from __future__ import annotations

import enum
import typing

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor import causes, explanations
from inplace_doctor.events import InplaceErrorRaised
from inplace_doctor.explanations import Sentences, explained_pairs, explains
from inplace_doctor.findings import Finding, Severity
from inplace_doctor.rules.registry import RULES, RuleContext, make_finding, rule


class DummyCause(enum.StrEnum):
    LEAF_WRITTEN = "dummy-leaf-written"


@pytest.fixture
def dummy_rule():
    """The recipe: a cause enum, a rule registered with `@rule` (its events, its tracer), and an
    explainer registered with `@explains`. Taken out again after the test."""

    @rule("IPD999", "dummy", "A dummy rule", Severity.WARNING, events=(InplaceErrorRaised,))
    def dummy(event: InplaceErrorRaised, ctx: RuleContext) -> Finding | None:
        """A write PyTorch refused, found again by a rule added in one place."""
        return make_finding("IPD999", cause=DummyCause.LEAF_WRITTEN, mutation=event.site, root_label=ctx.root_label)

    @explains("IPD999", DummyCause.LEAF_WRITTEN)
    def words(finding: Finding, root_label: str) -> Sentences:
        return Sentences(what=f"{finding.mutation.op.removeprefix('aten.')} wrote a leaf.", why="It is a dummy.", fix="do not")

    yield
    del RULES["IPD999"]
    del explanations._EXPLAINERS[("IPD999", DummyCause.LEAF_WRITTEN)]


@pytest.mark.parametrize("deep", [False, True])
def test_a_rule_added_the_documented_way_runs_in_both_tracers(dummy_rule, deep):
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError), ipd.watch(deep=deep, select=["IPD102", "IPD999"]) as session:
        w.add_(1)
    assert session.deep is deep  # the rule asked for no deep tracer: the fast one served it
    [dummy] = [f for f in session.findings if f.code == "IPD999"]
    assert dummy.cause is DummyCause.LEAF_WRITTEN and dummy.severity is Severity.WARNING
    assert dummy.message.startswith("add_ wrote a leaf. It is a dummy.\nFix: do not.")
    assert "IPD102" in [f.code for f in session.findings]


def test_every_cause_and_facts_type_is_in_its_union():
    """`Cause` and `Facts` in causes.py are the unions typed code checks against; a rule's new enum
    or facts record must be added there (the one line besides the rule's own module)."""
    in_union = set(typing.get_args(causes.Cause))
    for code, cause in explained_pairs():
        assert type(cause) in in_union, (
            f"{code}'s cause {type(cause).__name__} is not in `Cause`: add `| {type(cause).__name__}` to "
            f"`Cause = (...)` in src/inplace_doctor/causes.py"
        )
    facts = set(typing.get_args(causes.Facts))
    records = [v for v in vars(causes).values() if isinstance(v, type) and v.__name__.endswith("Facts") and v.__module__ == causes.__name__]
    for record in records:
        assert record in facts, f"add `| {record.__name__}` to `Facts = (...)` in src/inplace_doctor/causes.py"

