"""IPD104 through `.data`: a change backward reads is an error; the saved bytes put back before
backward (evaluate other weights, then restore, as Lookahead and SAM do) are not."""

from __future__ import annotations

import torch

import inplace_doctor as ipd


def _setup() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    lin(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    return lin, x, expected


def test_the_saved_bytes_put_back_through_data_before_backward_are_no_finding() -> None:
    lin, x, expected = _setup()
    with ipd.watch(lin) as session:
        y = lin(x)
        backup = lin.weight.data.clone()
        lin.weight.data.copy_(torch.zeros(3, 3))  # evaluate other weights ...
        lin.weight.data.copy_(backup)  # ... and put the saved bytes back
        y.sum().backward()
    assert torch.equal(x.grad, expected)  # backward computed what it would have
    assert session.findings == []


def test_a_data_write_backward_reads_is_still_a_confirmed_error() -> None:
    lin, x, expected = _setup()
    with ipd.watch(lin) as session:
        y = lin(x)
        backup = lin.weight.data.clone()
        lin.weight.data.mul_(2)
        lin.weight.data.add_(backup * 1e-3)  # not put back: other bytes
        y.sum().backward()
    assert not torch.equal(x.grad, expected)
    [finding] = session.findings
    assert (finding.code, finding.severity, finding.confirmed) == ("IPD104", ipd.Severity.ERROR, True)
    assert (finding.mutation.code or "").startswith("lin.weight.data.")  # one of the two writes


def test_bytes_put_back_then_changed_again_before_backward_are_an_error() -> None:
    lin, x, _ = _setup()
    with ipd.watch(lin) as session:
        y = lin(x)
        backup = lin.weight.data.clone()
        lin.weight.data.zero_()
        lin.weight.data.copy_(backup)
        lin.weight.data.add_(1.0)  # after the restore: backward reads these
        y.sum().backward()
    assert [f.code for f in session.findings if f.confirmed] == ["IPD104"]
