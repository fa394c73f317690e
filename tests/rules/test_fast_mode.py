"""The fast tracer (`watch(deep=False)`, issue 26) against the deep one, on every rule fixture.

Every fixture program of tests/rules runs twice with the rules the fast tracer
serves (`FAST_MODE_RULES`): once in deep mode, once in fast mode. Both must
report the same findings (code, severity, the lines that wrote, saved and
read, the message) and end the same way (ran, or raised which error). Rules
the fast tracer does not serve yet switch `watch(deep=False)` to deep mode,
and the report says so.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from conftest import in_fresh_thread

import inplace_doctor as ipd
from inplace_doctor.render.explain.checkpoint_recompute import _values
from inplace_doctor.rules import FAST_MODE_RULES

HERE = Path(__file__).resolve().parent
FIXTURES = sorted(HERE.glob("IPD*/*/*.py"))


def _line(site: Any) -> Any:
    if site is None:
        return None
    frame = site.stack[-1] if site.stack else None
    return (frame.file, frame.line) if frame is not None else (site.file, site.line)


def _message(finding: Any) -> str:
    """The message, less what it quotes of uninitialised memory (IPD111's `F.rrelu` noise as the
    recompute saved it), whose bytes differ from run to run."""
    facts = finding.facts
    if getattr(facts, "uninitialised", False) and facts.saved_values:
        return str(finding.message.replace(_values(facts.saved_values), "<uninitialised>"))
    return str(finding.message)


def _run(path: Path, deep: bool) -> tuple[bool, list[tuple[Any, ...]], str | None]:
    import torch

    torch.manual_seed(0)  # the same inputs in both runs: IPD105's message gives a measured difference
    raised = None
    session = ipd.watch(deep=deep, select=sorted(FAST_MODE_RULES))
    try:
        with session:
            runpy.run_path(str(path), run_name="__main__")
    except RuntimeError as e:
        raised = type(e).__name__
    found = sorted(
        (f.code, str(f.severity), _line(f.mutation), _line(f.saved), _line(f.read), _message(f))
        for f in session.findings
    )
    return session.deep, found, raised


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(HERE)))
def test_fast_mode_reports_what_deep_mode_reports(path: Path) -> None:
    ran_deep, deep_findings, deep_raised = in_fresh_thread(_run, path, True)
    ran_deep_when_fast, fast_findings, fast_raised = in_fresh_thread(_run, path, False)
    assert ran_deep and not ran_deep_when_fast
    assert fast_raised == deep_raised
    assert fast_findings == deep_findings


@pytest.mark.parametrize("code", sorted(set(ipd.RULES) - FAST_MODE_RULES))
def test_a_rule_the_fast_tracer_does_not_serve_turns_deep_mode_on_and_the_report_says_so(code: str) -> None:
    with ipd.watch(deep=False, select=[code]) as session:
        pass
    assert session.deep and session.deep_because == [code]
    report = session.report()
    assert "fast_tracer" not in report.stats
    assert any(code in note and "deep mode" in note for note in report.notes)


def test_only_the_fast_rules_run_fast() -> None:
    with ipd.watch(deep=False, select=sorted(FAST_MODE_RULES)) as session:
        pass
    assert not session.deep and session.report().stats["fast_tracer"] == 1


def test_a_training_step_under_the_fast_tracer_is_bit_identical_to_plain() -> None:
    import torch
    from torch import nn

    def step(fast: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(288, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(2, 3, 8, 8)
        for _ in range(2):
            opt.zero_grad()
            if fast:
                with ipd.watch(deep=False, select=sorted(FAST_MODE_RULES)) as session:
                    model(x).sum().backward()
                assert not session.deep and session.findings == []
            else:
                model(x).sum().backward()
            opt.step()
        return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]

    assert all(torch.equal(a, b) for a, b in zip(step(True), step(False)))
