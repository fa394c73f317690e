"""Which tracer runs when none is asked for (issue 26): the fast one when it serves every selected
rule, else the deep one with a note naming the rule; `INPLACE_DOCTOR_TRACER` sets the default."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.engines import tracer_mode
from inplace_doctor.errors import UsageError
from inplace_doctor.examples import SigmoidThenReLU
from inplace_doctor.rules import FAST_MODE_RULES, registry


def _fast(report: ipd.Report) -> bool:
    return report.stats.get("fast_tracer") == 1


def test_the_default_runs_the_fast_tracer_when_it_serves_every_selected_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracer_mode.ENVIRONMENT, raising=False)
    report = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8), select=sorted(FAST_MODE_RULES))
    assert _fast(report) and [f.code for f in report.findings] == ["IPD101"]
    assert not [n for n in report.notes if "tracer" in n]
    with ipd.watch(select=sorted(FAST_MODE_RULES)) as session:
        torch.randn(3, requires_grad=True).exp().add_(1)
    assert not session.deep and _fast(session.report())


def test_the_default_runs_deep_when_a_selected_rule_needs_it_and_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracer_mode.ENVIRONMENT, raising=False)
    monkeypatch.setitem(registry.RULES, "IPD104", replace(registry.RULES["IPD104"], fast=False))
    with ipd.watch(select=["IPD101", "IPD104"]) as session:
        torch.randn(3, requires_grad=True).exp().add_(1)
    assert session.deep and session.deep_because == ["IPD104"]
    report = session.report()
    assert not _fast(report)
    [note] = [n for n in report.notes if "tracer" in n]
    assert note.startswith("the deep tracer ran (every op through a dispatch mode) because IPD104 needs it")
    assert "asked" not in note  # nobody asked for the fast one


def test_deep_true_always_runs_the_deep_tracer_without_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracer_mode.ENVIRONMENT, raising=False)
    report = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8), select=sorted(FAST_MODE_RULES), deep=True)
    assert not _fast(report) and not [n for n in report.notes if "tracer" in n]
    assert [f.code for f in report.findings] == ["IPD101"]


@pytest.mark.parametrize(("value", "fast"), [("deep", False), ("fast", True), ("AUTO", True), ("", True)])
def test_the_environment_variable_sets_the_default(monkeypatch: pytest.MonkeyPatch, value: str, fast: bool) -> None:
    monkeypatch.setenv(tracer_mode.ENVIRONMENT, value)
    report = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8), select=sorted(FAST_MODE_RULES))
    assert _fast(report) is fast
    # an explicit argument wins over the variable
    explicit = ipd.audit(SigmoidThenReLU(), torch.randn(4, 8), select=sorted(FAST_MODE_RULES), deep=fast)
    assert _fast(explicit) is (not fast)


def test_the_variable_asking_for_fast_is_named_when_deep_mode_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tracer_mode.ENVIRONMENT, "fast")
    monkeypatch.setitem(registry.RULES, "IPD104", replace(registry.RULES["IPD104"], fast=False))
    with ipd.watch(select=["IPD104"]) as session:
        pass
    [note] = [n for n in session.report().notes if "tracer" in n]
    assert note.startswith(f"{tracer_mode.ENVIRONMENT}=fast asked for the fast tracer, but it ran in deep mode")


def test_a_bad_value_is_one_line_with_the_closest_choice(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(tracer_mode.ENVIRONMENT, "dep")
    with pytest.raises(UsageError, match=r"INPLACE_DOCTOR_TRACER='dep' is not a tracer; did you mean 'deep'\?"):
        ipd.watch()
    assert main(["audit", "inplace_doctor.examples:SigmoidThenReLU", "--input", "4x8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'deep'" in err[0]


def test_no_mode_is_left_on_the_stack_when_a_read_resolves_inside_backward() -> None:
    """A write through `.detach()` turns the fast tracer's read mode on in forward; the read it
    awaits comes in backward, where autograd later restores the mode stack as it was: the watch
    must still leave no mode behind (a leaked mode slowed and confused every later test)."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(8, 8)
    with ipd.watch() as session:
        scores = proj(torch.randn(2, 5, 8))[..., 0]
        mask = torch.zeros(scores.shape, dtype=torch.bool)
        mask[:, 3:] = True
        scores.detach()[mask] = -float("inf")
        assert torch._C._len_torch_dispatch_stack() == 1  # the read mode, awaiting the use
        torch.nn.functional.softmax(scores, dim=-1).sum().backward()
    assert session.tracer.pending_reads is not None and session.tracer.pending_reads.turned_on == 1
    assert torch._C._len_torch_dispatch_stack() == 0
