"""Findings are records: what a rule decided is a field (cause, facts, the roles of its sites), and
what later code decides (the text layout, SARIF's labels, IPD108's confirmation, folding) reads
those fields, never a sentence. Wording is the golden files' business; these assert on fields."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.causes import (
    ChangedResultCause,
    ForbiddenCause,
    SavedTensorCause,
    SideEffectCause,
    SiteRole,
    Unreached,
    VersionFacts,
    WriteForm,
)
from inplace_doctor.findings import Finding, Severity
from inplace_doctor.render import sarif
from inplace_doctor.render.text import finding_lines
from inplace_doctor.rules import RULES
from inplace_doctor.rules.dispatch import Analyzer
from inplace_doctor.sites import Site


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(x)


def test_an_inplace_flag_is_the_sites_form_not_part_of_its_op():
    """`Site.op` is the op (`relu`); the flag is `Site.form`. Text still reads `relu (inplace=True)`."""
    model = _Residual()
    with ipd.watch(model) as session:
        model(torch.randn(4, 8) * 1)
    [f] = [f for f in session.findings if f.code == "IPD105"]
    assert f.mutation.op == "relu" and f.mutation.form is WriteForm.FLAG
    assert f.cause is ChangedResultCause.FLAG and f.severity is Severity.ERROR
    assert f.facts is not None and f.facts.max_difference > 0
    assert f.to_dict()["mutation"]["form"] == "inplace=True" and f.to_dict()["cause"] == "flag"
    assert any("`relu (inplace=True)`" in line for line, _ in finding_lines(f))


def test_an_augmented_assignment_is_its_own_form_and_cause():
    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x * 1
        keep = h
        h += 1
        return torch.cat([keep, h])

    with ipd.watch() as session:
        forward(torch.randn(3))
    found = [f for f in session.findings if f.code == "IPD105"]
    assert found and all(f.mutation.form is WriteForm.AUGMENTED for f in found)
    assert all(f.cause is ChangedResultCause.AUGMENTED and f.severity is Severity.WARNING for f in found)


def test_the_line_that_made_the_views_is_a_site_with_its_role_and_the_layout_reads_the_role():
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(RuntimeError), ipd.watch() as session:
        first, _ = (x * 2).unbind(0)
        first.mul_(2)
    [f] = session.findings
    assert f.cause is ForbiddenCause.MULTIPLE_VIEWS and f.read is not None
    assert f.read_role is SiteRole.VIEWS_MADE
    assert [role for role, _ in f.sites] == [SiteRole.WRITE, SiteRole.VIEWS_MADE]
    lines = [line for line, _ in finding_lines(f)]
    assert "[PyTorch raised]" in lines[0] and any(line.strip().startswith("views from") for line in lines)
    related = sarif._related(f, ".", "model")
    assert [r["message"]["text"] for r in related] == ["views made here"]
    # the same finding with its other line a plain read: the layout follows the field alone
    read = f.with_(read_role=SiteRole.READ)
    lines = [line for line, _ in finding_lines(read)]
    assert "[PyTorch raised]" not in lines[0] and any(line.strip().startswith("read by") for line in lines)


def test_details_are_the_typed_fields_as_json_and_nothing_reads_them_back():
    site = Site(op="aten.mul_", file="m.py", line=3)
    f = Finding(
        code="IPD101", severity=Severity.ERROR, title="t", mutation=site, cause=SavedTensorCause.OVERWRITTEN,
        saved=Site(op="aten.sigmoid", file="m.py", line=2), facts=VersionFacts(0, 1), slot="SigmoidBackward0.result", target="0.weight",
    )
    assert f.details == {
        "why": f.why, "cause": "overwritten", "slot": "SigmoidBackward0.result", "target": "0.weight",
        "saved_version": 0, "version_now": 1,
    }
    json.dumps(f.to_dict())  # plain JSON


def test_a_rule_context_answers_with_the_asking_rules_own_findings_only():
    """IPD108 confirms its own earlier finding by its cause; another rule's finding of the same line
    is invisible to it (a rule never reads another rule's findings)."""
    analyzer = Analyzer([RULES["IPD101"], RULES["IPD108"]])
    site = Site(op="aten.mul_", file="m.py", line=3)
    other = Finding(
        code="IPD101", severity=Severity.ERROR, title="t", mutation=site, cause=SavedTensorCause.OVERWRITTEN
    )
    analyzer.findings.append(other)
    ctx = analyzer._contexts["IPD108"]
    assert ctx.earlier(SideEffectCause.CHECKPOINT_INPUT) is None
    own = other.with_(code="IPD108", cause=SideEffectCause.CHECKPOINT_INPUT)
    analyzer.findings.append(own)
    assert ctx.earlier(SideEffectCause.CHECKPOINT_INPUT) is own
    assert analyzer._contexts["IPD101"].earlier(SideEffectCause.CHECKPOINT_INPUT) is None
    assert not hasattr(ctx, "findings")


def _region(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    x.mul_(2)
    return y


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpoint_input_write_is_confirmed_by_its_cause(reentrant):
    from torch.utils.checkpoint import checkpoint

    with pytest.raises(ipd.InplaceError), ipd.watch() as session:
        x = torch.randn(3, requires_grad=True) * 1
        checkpoint(_region, x, use_reentrant=reentrant).sum().backward()
    [f] = session.findings
    assert f.code == "IPD108" and f.cause is SideEffectCause.CHECKPOINT_INPUT and f.confirmed is True


def test_each_earlier_write_of_one_saved_tensor_has_its_own_cause():
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(ipd.InplaceError), ipd.watch() as session:
        s = torch.sigmoid(x)
        s.add_(1)
        s.mul_(2)
        s.sum().backward()
    causes = sorted(str(f.cause) for f in session.findings if f.code == "IPD101")
    assert causes == [SavedTensorCause.ALSO_WRITTEN, SavedTensorCause.OVERWRITTEN]


def test_memory_names_modules_by_path_and_the_report_adds_the_model_label():
    model = nn.Sequential(nn.Linear(8, 16), nn.Sigmoid(), nn.Linear(16, 2))
    report = ipd.memory(model, torch.randn(4, 8))
    saved = [h for h in report.peaks["forward"].holdings if h.category == "saved activations"]
    assert saved and all(h.module is None or not h.module.startswith("model") for h in saved)
    assert {h.where for h in saved if h.module is not None} <= {"model"} | {f"model.{h.module}" for h in saved}
    assert all(not name.startswith("model") for name, _ in report.saved_by_module())


def test_a_flag_call_keeps_its_functional_name():
    with ipd.watch() as session:
        h = torch.randn(4) * 1
        torch.cat([h, F.relu(h, inplace=True)])
    [f] = [f for f in session.findings if f.code == "IPD105"]
    assert f.mutation.op == "relu" and f.mutation.form is WriteForm.FLAG


def test_a_finding_stores_no_sentence_its_words_follow_its_records():
    """One copy of each verdict (issue 39): a finding's fields are records only, and its English is
    made when asked, from them: change a record and the words change with it."""
    from dataclasses import fields

    site = Site(op="aten.mul_", file="m.py", line=3, module="0", module_type="Linear")
    f = Finding(
        code="IPD101", severity=Severity.ERROR, title="t", mutation=site, cause=SavedTensorCause.OVERWRITTEN,
        saved=Site(op="aten.sigmoid", file="m.py", line=2), facts=VersionFacts(0, 1),
    )
    assert not {"what", "why", "fix", "unconfirmed_reason", "fix_alternatives"} & {x.name for x in fields(f)}
    assert all(type(getattr(f, x.name)) is not str or x.name in {"code", "title", "slot", "target", "root_label"}
               for x in fields(f))
    assert "model.0" in f.what and "net.0" in f.with_(root_label="net").what
    assert f.unconfirmed_reason == ""
    assert f.with_(confirmed=False, unreached=Unreached.NO_BACKWARD).unconfirmed_reason.startswith("backward was not run")
