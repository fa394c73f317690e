"""IPD110: a graph tensor changed outside autograd (`.detach()`/`.data`, `no_grad`), then used.

Through `watch`, `audit` on a model and `inplace-doctor run` on a script; that the gradients really
are those of the unwritten tensor (the PyTorch fact the rule rests on); and the near misses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import line_of
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import Severity
from inplace_doctor.causes import Unreached


class Masked(nn.Module):
    def __init__(self, through_data: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)
        self.through_data = through_data

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.through_data:
            h.data[h < 0] = 0  # write:data
        else:
            h.detach()[h < 0] = 0  # write:masked
        return self.head(h)  # use:masked


def _ipd110(findings: list[ipd.Finding]) -> ipd.Finding:
    hits = [f for f in findings if f.code == "IPD110"]
    assert len(hits) == 1, [(f.code, f.message) for f in findings]
    return hits[0]


def test_the_pytorch_fact_gradients_follow_the_history_of_the_unwritten_tensor() -> None:
    torch.manual_seed(0)
    fc, x = nn.Linear(3, 3), torch.randn(2, 3)
    h = fc(x)
    h.detach().mul_(2)
    h.sum().backward()
    written = fc.weight.grad.clone()
    fc.weight.grad = None
    fc(x).sum().backward()
    assert torch.equal(written, fc.weight.grad)  # as if `mul_(2)` had not run: the factor is missing


def test_watch_names_the_write_and_the_use_and_backward_confirms() -> None:
    torch.manual_seed(0)
    model, x = Masked(), torch.randn(4, 8)
    with ipd.watch() as session:
        model(x).sum().backward()
    f = _ipd110(session.findings)
    assert f.severity is Severity.WARNING and f.confirmed is True
    assert f.mutation.line == line_of(__file__, "# write:masked") and f.mutation.op == "aten.index_put_"
    assert f.read is not None and f.read.line == line_of(__file__, "# use:masked") and f.read.op == "aten.addmm"
    assert f.read.module is not None and f.read.module.endswith("head")
    assert f.mutation.file == __file__ and f.read.file == __file__
    assert "through a `.detach()` alias" in f.what and "as if the write had not happened" in f.why
    assert "`h = h.masked_fill(h < 0, 0)`" in f.fix


def _nested_sessions(alias: str) -> tuple[list[ipd.Finding], list[ipd.Finding], int]:
    torch.manual_seed(0)
    model, tag = Masked(through_data=alias == "data"), "# write:data" if alias == "data" else "# write:masked"
    x = torch.randn(4, 8)
    with ipd.watch() as outer, ipd.watch() as inner:
        model(x).sum().backward()
    assert "data" not in torch.Tensor.__dict__ and torch.Tensor.detach is torch._C.TensorBase.detach
    return outer.findings, inner.findings, line_of(__file__, tag)


@pytest.mark.parametrize("alias", ["detach", "data"])
def test_both_of_two_nested_sessions_see_a_write_through_detach_or_data(alias: str) -> None:
    """`Tensor.detach` and `Tensor.data` are wrapped once for all sessions, each told on its thread
    (before, `.data` was wrapped by the first session in only), and PyTorch's put back after. The
    inner session is not told of the writes and detaches the outer one's own work makes (before, an
    inner fast session took them for the program's and lost the finding)."""
    outer, inner, line = _nested_sessions(alias)
    assert _ipd110(outer).mutation.line == line and _ipd110(inner).mutation.line == line


def test_audit_on_a_model_reports_it_confirmed() -> None:
    torch.manual_seed(0)
    report = ipd.audit(Masked(), torch.randn(4, 8))
    f = _ipd110(report.findings)
    assert f.confirmed is True and f.severity is Severity.WARNING
    assert (f.mutation.line, f.read.line) == (line_of(__file__, "# write:masked"), line_of(__file__, "# use:masked"))
    assert "model.head" in f.message and "model.fc" not in f.what.split(", and then")[1]


def test_audit_forward_only_keeps_it_as_an_unconfirmed_warning() -> None:
    report = ipd.audit(Masked(), torch.randn(4, 8), backward=False)
    f = _ipd110(report.findings)
    assert f.confirmed is False and f.severity is Severity.WARNING and f.unreached is Unreached.NO_BACKWARD


def test_run_reports_both_lines_of_a_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        torch.manual_seed(0)
        fc, head = nn.Linear(8, 8), nn.Linear(8, 1)
        opt = torch.optim.SGD([*fc.parameters(), *head.parameters()], lr=0.1)
        for _ in range(2):
            h = fc(torch.randn(4, 8))
            h.data.mul_(2)
            loss = head(h).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """))
    done = subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 1, done.stderr
    assert "IPD110" in done.stderr and "train.py:9" in done.stderr and "train.py:10" in done.stderr
    assert "replace `h.data.mul_(2)` with `h = h.mul(2)`" in done.stderr


def test_a_use_whose_graph_is_freed_without_backward_is_dropped() -> None:
    fc = nn.Linear(8, 8)
    with ipd.watch() as session:
        h = fc(torch.randn(4, 8))
        h.detach().clamp_(min=0)
        total = h.sum().item()  # a use that is only logged
    assert total == total and session.findings == []
    assert session.report().stats["predictions_dropped"] == 1


def test_views_of_leaves_under_no_grad_and_tensors_without_grad_are_not_reported() -> None:
    p = nn.Parameter(torch.randn(6))
    with ipd.watch() as session:
        v = p[:3]  # a view of a leaf, with history (SliceBackward0)
        with torch.no_grad():
            v.mul_(2)
        (p * 3).sum().backward()
        plain = torch.randn(4) * 2
        plain.detach()[0] = 1
        (plain * p[:4]).sum().backward()
    assert [f for f in session.findings if f.code == "IPD110"] == []


@pytest.mark.parametrize("deep", [True, False])
def test_a_view_of_the_written_tensor_used_later_is_reported(deep: bool) -> None:
    fc = nn.Linear(8, 8)
    with ipd.watch(deep=deep) as session:
        h = fc(torch.randn(4, 8))
        with torch.inference_mode():
            h[:, :2].zero_()  # write:inference
        h[:, 1].sum().backward()  # use:view
    f = _ipd110(session.findings)
    assert (f.mutation.line, f.read.line) == (line_of(__file__, "# write:inference"), line_of(__file__, "# use:view"))
    assert "torch.inference_mode()" in f.what and f.confirmed is True


@pytest.mark.parametrize("deep", [True, False])
def test_a_write_in_a_function_decorated_with_inference_mode_is_reported(deep: bool) -> None:
    @torch.inference_mode()
    def clear(h: torch.Tensor) -> None:
        h[:, :2].zero_()  # write:decorated

    fc = nn.Linear(8, 8)
    with ipd.watch(deep=deep) as session:
        h = fc(torch.randn(4, 8))
        clear(h)
        (h * 2).sum().backward()  # use:decorated
    f = _ipd110(session.findings)
    assert (f.mutation.line, f.read.line) == (line_of(__file__, "# write:decorated"), line_of(__file__, "# use:decorated"))


@pytest.mark.parametrize("deep", [True, False])
def test_writes_under_inference_mode_into_inference_tensors_or_tensors_without_grad_are_not_reported(
    deep: bool,
) -> None:
    fc = nn.Linear(8, 8)
    scale = torch.ones(4, 8)  # made outside, no grad: a buffer, not a graph tensor
    with ipd.watch(deep=deep) as session:
        h = fc(torch.randn(4, 8))
        with torch.inference_mode():
            mask = torch.ones(4, 8)  # an inference tensor
            mask[:, 0].zero_()
            scale.mul_(0.5)
        (h * mask.clone() * scale).sum().backward()
    assert session.findings == []


def test_a_write_that_also_changes_a_saved_tensor_is_left_to_ipd104() -> None:
    with ipd.watch() as session:
        x = torch.randn(4, requires_grad=True)
        s = torch.sigmoid(x)
        s.data.mul_(0.5)
        s.sum().backward()
    assert [f.code for f in session.findings] == ["IPD104"]
