"""A write into what a custom Function returned as-is (issue 37, item 9): the fix names the Function
and `ctx.mark_dirty`, and each of its choices, applied, makes the program run with no finding."""

from __future__ import annotations

import pytest
import torch

import inplace_doctor as ipd


class Passthrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x  # its input as-is

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return g


class Cloned(Passthrough):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()  # the fix's first choice


class ScaledInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        x.mul_(2)
        ctx.mark_dirty(x)  # the fix's second choice: forward writes its input and says so
        return x

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return g * 2


def _step(function: type[torch.autograd.Function]) -> torch.Tensor:
    x = torch.randn(3, requires_grad=True)
    y = function.apply(x * 1)
    y.mul_(2)
    y.sum().backward()
    return x.grad


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
def test_the_fix_names_the_function_and_mark_dirty(deep: bool) -> None:
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch(deep=deep):
        _step(Passthrough)
    (f,) = raised.value.findings
    assert f.code == "IPD103" and "`Passthrough`'s forward" in f.fix and "ctx.mark_dirty" in f.fix
    with ipd.watch(deep=deep) as session:  # the first choice the fix names, applied
        grad = _step(Cloned)
    assert session.findings == [] and torch.isfinite(grad).all()
    with ipd.watch(deep=deep) as session:  # the second: PyTorch no longer refuses the write
        grad = _step(ScaledInPlace)
    # (IPD110 still warns here: a known false positive for a mark_dirty output written in place again)
    assert "IPD103" not in [f.code for f in session.findings] and torch.isfinite(grad).all()
