"""IPD105 through another object over the overwritten memory, made before an `inplace=True` call (`stale_aliases.py`).

Each program's truth is measured: the forward with the flag off (what the in-place form must equal) against the
forward as written; a read is reported exactly when a value read differs in kind, by either tracer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inplace_doctor as ipd

Forward = Callable[[torch.Tensor, bool], torch.Tensor]


def kept_slice(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h[:, :4]
    y = F.relu(h, inplace=inplace)
    return y[:, 4:] * kept


def kept_detach(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    logged = h.detach()
    y = F.relu(h, inplace=inplace)
    return y + logged.mean()


def kept_transposed_then_viewed(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h.t()
    y = F.relu(h, inplace=inplace)
    return y.sum() + kept.reshape(-1)[:3].sum()  # the view of the stale view is read


def kept_and_summed_into_python(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h[0]
    y = F.relu(h, inplace=inplace)
    return y * kept.sum().item()


def views_of_the_result(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    y = F.relu(h, inplace=inplace)
    first = y[:, :4]
    again = first.detach().t().contiguous()
    return first.sum() + again.sum() + y[1].sum()


def the_half_not_written(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    a, b = h[:, ::2], h[:, 1::2]
    a = F.relu(a, inplace=inplace)
    return a * b


def only_metadata_read(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h[:, :4]
    y = F.relu(h, inplace=inplace)
    return y * (kept.shape[1] + kept.size(0) + kept.dim() + kept.numel())


def a_stale_view_overwritten_then_read(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h[:, :4]
    y = F.relu(h, inplace=inplace)
    used = y.sum()
    kept = kept.clone() if not inplace else kept  # (out of place: a copy to write)
    kept.fill_(2.0)  # written without being read: what it held before no longer matters
    return used + kept.sum()


def kept_then_updated_in_place(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h[:, :4]
    y = F.relu(h, inplace=inplace)
    kept = kept if inplace else kept.clone()  # (out of place: a copy to update)
    kept += 1  # reads what it updates
    return y.sum() + kept.sum()


def kept_then_rectified_in_place(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 1.5
    kept = h[:, :4]
    y = F.relu(h, inplace=inplace)
    used = y.sum()
    return used + F.hardtanh(kept, -0.2, 0.2, inplace=inplace).sum()


def second_write_after_a_view_of_the_first_result(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    h = x * 2 - 0.5
    y = F.relu(h, inplace=inplace)
    between = y[:, :4]  # made after the first write, before the second
    z = F.hardtanh(y, 0.0, 0.3, inplace=inplace)
    return z.sum() + between.sum()


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return -grad


def _first_half(x: torch.Tensor) -> torch.Tensor:
    return x[:, :4]


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch.jit.script is deprecated; programs still use it
    _scripted_first_half = torch.jit.script(_first_half)


def views_made_by_a_function_and_scripted_code(x: torch.Tensor, inplace: bool) -> torch.Tensor:
    # tensors made after the write by calls whose ops no torch-level call of the program shows
    h = x * 1.5
    y = F.relu(h, inplace=inplace)
    return _GradReverse.apply(y).sum() + _scripted_first_half(y).sum()


READ = [kept_slice, kept_detach, kept_then_updated_in_place, kept_then_rectified_in_place, kept_transposed_then_viewed, kept_and_summed_into_python,
        second_write_after_a_view_of_the_first_result]
NOT_READ = [views_of_the_result, the_half_not_written, only_metadata_read, a_stale_view_overwritten_then_read,
            views_made_by_a_function_and_scripted_code]


class Wrap(nn.Module):
    def __init__(self, forward: Forward, inplace: bool) -> None:
        super().__init__()
        self.run, self.inplace = forward, inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x, self.inplace)


def _x() -> torch.Tensor:
    return torch.randn(6, 8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("forward", READ + NOT_READ, ids=lambda f: f.__name__)
def test_the_truth_of_each_program_is_what_the_tests_below_assume(forward: Forward) -> None:
    differs = not torch.equal(forward(_x(), True), forward(_x(), False))
    assert differs == (forward in READ)


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("forward", READ, ids=lambda f: f.__name__)
def test_a_read_of_an_alias_made_before_the_write_is_reported_with_the_write_and_the_read(
    forward: Forward, deep: bool
) -> None:
    report = ipd.audit(Wrap(forward, True), _x(), deep=deep)
    found = [f for f in report.findings if f.code == "IPD105"]
    assert len(found) == 1, [f.message for f in report.findings]
    [finding] = found
    assert finding.mutation.op.startswith(("relu", "hardtanh")) and finding.read is not None
    assert finding.read.line > finding.mutation.line
    assert "made before the write" in finding.message


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("forward", NOT_READ, ids=lambda f: f.__name__)
def test_no_read_is_reported_where_the_values_read_are_the_out_of_place_ones(forward: Forward, deep: bool) -> None:
    report = ipd.audit(Wrap(forward, True), _x(), deep=deep)
    assert [f.code for f in report.findings if f.code == "IPD105"] == [], [f.message for f in report.findings]


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_the_difference_given_bounds_what_the_stale_view_read_and_is_exact_where_the_write_was_copied(
    deep: bool
) -> None:
    x = _x()
    h = x * 1.5
    region = float((F.relu(h[:, :4]) - h[:, :4]).abs().max())  # kept_slice's view: columns 0-3 only
    whole = float((F.relu(h) - h).abs().max())  # ReLU's change is measured without a copy: over all it wrote
    assert region < whole
    [finding] = [f for f in ipd.audit(Wrap(kept_slice, True), x, deep=deep).findings if f.code == "IPD105"]
    assert finding.facts.max_difference == pytest.approx(whole, rel=1e-6)
    assert f"the write changed values by up to {whole:.6g}" in finding.message

    def silu_kept(x: torch.Tensor, inplace: bool) -> torch.Tensor:  # SiLU's input is copied before its write
        h = x * 1.5
        kept = h[:, :4]
        return F.silu(h, inplace=inplace)[:, 4:] * kept

    region = float((F.silu(h[:, :4]) - h[:, :4]).abs().max())
    assert region < float((F.silu(h) - h).abs().max())
    [finding] = [f for f in ipd.audit(Wrap(silu_kept, True), x, deep=deep).findings if f.code == "IPD105"]
    assert finding.facts.max_difference == pytest.approx(region, rel=1e-6)


def test_an_augmented_assignment_through_a_view_of_a_buffer_is_not_a_stale_read() -> None:
    # `x += y` may mean to update the memory other objects read: only flags, whose one purpose is
    # to save memory, are held to the out-of-place meaning through other objects
    def forward(x: torch.Tensor) -> torch.Tensor:
        buf = torch.zeros(6, 8)
        window = buf[:, :4]
        window += x[:, :4]
        return buf * 2

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return forward(x)

    assert [f.code for f in ipd.audit(M(), _x()).findings] == []


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_the_program_computes_the_same_with_and_without_the_tool(deep: bool) -> None:
    for forward in READ + NOT_READ:
        plain = forward(_x().requires_grad_(), True)
        x = _x().requires_grad_()
        with ipd.watch(deep=deep):
            watched = forward(x, True)
        assert torch.equal(plain, watched), forward.__name__


class _KeepsASlice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        kept = h[:, :4]
        return self.act(h)[:, 4:] * kept


def test_the_printed_fix_applied_makes_the_program_compute_what_was_meant() -> None:
    torch.manual_seed(0)
    model, x = _KeepsASlice(), _x()
    [finding] = ipd.audit(model, x).findings
    assert finding.code == "IPD105" and "set `model.act.inplace = False`" in finding.fix, finding.fix
    with torch.no_grad():
        h = model.fc(x)
        meant = F.relu(h)[:, 4:] * h[:, :4]  # the slice holds the pre-activation values
        assert not torch.equal(model(x), meant)  # as written it does not
        model.act.inplace = False  # the fix, as printed
        assert torch.equal(model(x), meant)
    assert ipd.audit(model, x).findings == []
