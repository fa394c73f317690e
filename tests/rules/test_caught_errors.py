"""Errors PyTorch raises at an in-place call that the program catches (issue 37, item 1).

Training loops catch `RuntimeError` (skip a bad batch, retry, log and go on). An error PyTorch
raised at the write never leaves the watched code then, and the tool used to print "0 findings".
Each such error is a finding now, in both tracers, under `watch()`, `audit()` and `run`, with the
same severity (and exit code) as an uncaught one, and the report says the program caught it. The
program itself sees exactly what it sees without the tool.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import inplace_doctor as ipd
from inplace_doctor.findings import Severity
from inplace_doctor.render.text import render as render_text

TRACERS = pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])


def _line(marker: str) -> int:
    with open(__file__, encoding="utf-8") as source:
        return next(i for i, text in enumerate(source, 1) if marker in text and "_line(" not in text)


def _manual_sgd_that_skips_failed_steps(log: list[str]) -> nn.Module:
    """A hand-written SGD step without `torch.no_grad()`: PyTorch refuses the update of the leaf,
    the loop logs it and goes on, and the model never trains."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    for _ in range(3):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        try:
            for p in model.parameters():
                p -= 0.1 * p.grad  # <manual sgd>
        except RuntimeError as e:
            log.append(f"skipped a step: {e}")
    return model


@TRACERS
def test_a_training_loop_that_catches_the_leaf_error_is_a_finding(deep: bool) -> None:
    plain_log: list[str] = []
    plain = _manual_sgd_that_skips_failed_steps(plain_log)
    log: list[str] = []
    with ipd.watch(deep=deep) as session:
        watched = _manual_sgd_that_skips_failed_steps(log)
    assert log == plain_log and len(log) == 3  # the program saw what it sees without the tool
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), watched.state_dict().values()))
    (f,) = session.findings
    assert (f.code, f.severity, f.caught, f.count) == ("IPD102", Severity.ERROR, True, 3)
    assert f.mutation.line == _line("# <manual sgd>") and f.mutation.op == "aten.sub_"
    assert session.failed()
    out = io.StringIO()
    render_text(session.report(), out, color=False)
    assert "caught PyTorch's error and went on" in out.getvalue()


class _MaskedWithFallback(nn.Module):
    """A forward that tries the in-place write on a view of its parameter and falls back when
    PyTorch refuses it: the fallback is the program's design, the refused write still a finding."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale[:3]
        try:
            s.mul_(2)  # <refused view of a leaf>
        except RuntimeError:
            s = s * 2
        return x[:, :3] * s


@TRACERS
def test_audit_reports_an_error_the_forward_caught(deep: bool) -> None:
    model = _MaskedWithFallback()
    report = ipd.audit(model, torch.randn(2, 6), deep=deep)
    (f,) = report.findings
    assert (f.code, f.caught, f.mutation.line) == ("IPD102", True, _line("# <refused view of a leaf>"))
    assert torch.equal(model.scale, torch.ones(6))  # the refused write never ran
    assert report.to_dict()["findings"][0]["caught"] is True


@TRACERS
def test_unbind_views_written_in_a_loop_that_catches(deep: bool) -> None:
    with ipd.watch(deep=deep) as session:
        x = torch.randn(3, 4, requires_grad=True)
        rows = (x * 1).unbind(0)
        kept = []
        for row in rows:
            try:
                row.mul_(2)  # <unbind view>
            except RuntimeError:
                kept.append(row * 2)
        torch.stack(kept).sum().backward()
    (f,) = session.findings
    assert (f.code, f.caught, f.count, f.mutation.line) == ("IPD103", True, 3, _line("# <unbind view>"))
    assert f.read is not None  # where the views were made, as for the uncaught error


@TRACERS
def test_caught_errors_that_are_not_in_place_hazards_stay_silent(deep: bool) -> None:
    """A correct program that catches errors of in-place calls PyTorch raises for other reasons (a
    shape that does not broadcast, a dtype it cannot cast to) and of other calls."""
    with ipd.watch(deep=deep) as session:
        a, b = torch.randn(3, 4), torch.randn(4, 3)
        try:
            a.add_(b)  # shapes do not broadcast
        except RuntimeError:
            a = a + b.t()
        i = torch.zeros(3, dtype=torch.long)
        try:
            i.add_(0.5)  # a float result cannot be cast to long in place
        except RuntimeError:
            pass
        with contextlib.suppress(RuntimeError):
            torch.linalg.cholesky(-torch.eye(2))
    assert session.findings == []


def test_an_uncaught_error_at_the_write_is_reported_once_not_as_caught() -> None:
    w = torch.randn(3, requires_grad=True)
    for deep in (False, True):
        with pytest.raises(ipd.InplaceError), ipd.watch(deep=deep) as session:
            w.add_(1)
        (f,) = session.findings
        assert f.code == "IPD102" and not f.caught


_LOOP = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = torch.randn(8, requires_grad=True)  # a gate the script means to clip in place
for step in range(2):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    loss = nn.functional.mse_loss(model(x), y) + w.sum() * 0
    opt.zero_grad()
    loss.backward()
    opt.step()
    try:
        w.clamp_(-1, 1)
    except RuntimeError as e:
        print(f"step {step}: could not clip ({type(e).__name__}: {e})")
print("trained", round(loss.item(), 4))
"""


@TRACERS
def test_run_reports_the_caught_error_and_exits_as_for_an_uncaught_one(tmp_path, deep: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_LOOP))
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    argv = [sys.executable, "-m", "inplace_doctor", "run", *(["--deep"] if deep else []), str(script)]
    tool = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={"NO_COLOR": "1", **_env()})
    assert plain.returncode == 0 and "could not clip (RuntimeError: a leaf Variable" in plain.stdout
    assert tool.stdout == plain.stdout
    assert tool.returncode == 1, tool.stderr
    assert "IPD102" in tool.stderr and "(x2)" in tool.stderr and "caught PyTorch's error" in tool.stderr
    assert "0 finding" not in tool.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "NO_COLOR"}


# -- A report read before backward (issue 37, item 4) ------------------------------------------


@TRACERS
def test_a_report_read_before_backward_lists_the_prediction(deep: bool) -> None:
    with ipd.watch(deep=deep) as session:
        x = torch.randn(4, requires_grad=True)
        h = torch.sigmoid(x)  # <pending save>
        h.mul_(2)  # <pending write>
        early = session.report()
        out = io.StringIO()
        render_text(early, out, color=False)
        (f,) = early.findings
        assert f.code == "IPD101" and f.confirmed is False and f.unreached.value == "pending"
        assert f.mutation.line == _line("# <pending write>") and f.saved.line == _line("# <pending save>")
        assert "[predicted]" in out.getvalue() and "No in-place hazards found" not in out.getvalue()
        assert early.to_dict()["findings"][0]["unreached"] == "pending"
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            h.sum().backward()
        (after,) = session.report().findings  # backward reached it: confirmed, no longer predicted
        assert after.confirmed is True and after.unreached is None


@TRACERS
def test_a_report_read_inside_the_block_has_the_errors_caught_so_far(deep: bool) -> None:
    with ipd.watch(deep=deep) as session:
        w = torch.randn(3, requires_grad=True)
        with contextlib.suppress(RuntimeError):
            w.add_(1)
        assert [(f.code, f.caught) for f in session.report().findings] == [("IPD102", True)]
    assert [(f.code, f.caught) for f in session.findings] == [("IPD102", True)]  # once, not twice


@TRACERS
def test_a_caught_error_of_backward_is_marked_caught(deep: bool) -> None:
    with ipd.watch(deep=deep) as session:
        for _ in range(2):
            x = torch.randn(4, requires_grad=True)
            h = torch.sigmoid(x)
            h.mul_(2)
            try:
                h.sum().backward()
            except RuntimeError:
                pass  # a loop that skips the step
    (f,) = session.findings
    assert (f.code, f.confirmed, f.caught, f.severity) == ("IPD101", True, True, Severity.ERROR)


def test_an_error_of_backward_that_leaves_the_watch_or_audit_is_not_caught() -> None:
    with pytest.raises(ipd.InplaceError), ipd.watch() as session:
        x = torch.randn(4, requires_grad=True)
        h = torch.sigmoid(x)
        h.mul_(2)
        h.sum().backward()
    assert [f.caught for f in session.findings] == [False]
    from inplace_doctor.examples import SigmoidThenReLU

    assert [f.caught for f in ipd.audit(SigmoidThenReLU(), torch.randn(4, 8)).findings] == [False]
