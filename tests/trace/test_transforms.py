"""`torch.func` transforms that refuse saved-tensor hooks (grad, vjp, jacrev, hessian) run under the
tracer as they do without it: its hooks are set aside for them, and put back."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, hessian, jacrev, vjp, vmap

import inplace_doctor as ipd


def _transforms(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (xb,)).pow(2).sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)  # the per-sample-gradients tutorial
    _, pullback = vjp(lambda t: torch.tanh(model(t)), x)
    return [
        grad(lambda t: model(t).sum())(x[0]),
        *per_sample.values(),
        *pullback(torch.ones(x.shape[0], 1)),
        jacrev(lambda t: torch.sigmoid(model(t)))(x[0]),
        hessian(lambda t: model(t).pow(3).sum())(x[0]),
    ]


def test_grad_vjp_jacrev_and_hessian_run_under_watch_with_the_results_of_a_plain_run() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x = torch.randn(5, 3)
    plain = _transforms(model, x)
    original = torch.autograd.graph.disable_saved_tensors_hooks
    with ipd.watch(model) as session:
        watched = _transforms(model, x)
        # outside the transforms the tracer is itself again: its hooks are back on top
        h = torch.sigmoid(model(x))
        h.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            h.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert [f.code for f in session.findings] == ["IPD101"]
    assert any("torch.func transform call(s)" in n for n in session.report().notes)
    assert torch.autograd.graph.disable_saved_tensors_hooks is original
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_the_users_own_saved_tensor_hooks_still_make_grad_refuse_as_without_the_tool() -> None:
    model = torch.nn.Linear(3, 1)
    x = torch.randn(3)
    with ipd.watch(model), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), \
            pytest.raises(RuntimeError, match="don't yet support saved tensor hooks"):
        grad(lambda t: model(t).sum())(x)
