"""`audit` gives back each parameter's and input's `requires_grad` as found, whatever forward
flipped (`p.requires_grad_(False)` in forward, freezing or unfreezing), also when forward raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inplace_doctor as ipd


class FreezesInForward(nn.Module):
    """Freezes `frozen_here` and unfreezes `thawed_here` on the first call (a warm-up schedule
    written inside forward); optionally raises afterwards."""

    def __init__(self, raise_after: bool = False) -> None:
        super().__init__()
        self.frozen_here = nn.Linear(4, 4)
        self.thawed_here = nn.Linear(4, 4)
        self.thawed_here.requires_grad_(False)
        self.raise_after = raise_after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.frozen_here.weight.requires_grad_(False)
        self.thawed_here.bias.requires_grad_(True)
        x.requires_grad_(True)  # an input leaf the caller passed without grad
        if self.raise_after:
            raise RuntimeError("forward failed after flipping requires_grad")
        return self.thawed_here(self.frozen_here(x))


def flags(model: nn.Module) -> dict[str, bool]:
    return {name: p.requires_grad for name, p in model.named_parameters()}


def test_requires_grad_flipped_in_forward_is_given_back() -> None:
    model, x = FreezesInForward(), torch.randn(2, 4)
    before = flags(model)
    ipd.audit(model, x)
    assert flags(model) == before
    assert x.requires_grad is False and x.grad is None


def test_requires_grad_is_given_back_when_forward_raises() -> None:
    model, x = FreezesInForward(raise_after=True), torch.randn(2, 4)
    before = flags(model)
    with pytest.raises(RuntimeError, match="forward failed"):
        ipd.audit(model, x)
    assert flags(model) == before
    assert x.requires_grad is False


def test_a_buffer_given_requires_grad_in_forward_is_left_without_it() -> None:
    class GradBuffer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.scale.requires_grad_(True)
            return self.fc(x) * self.scale

    model = GradBuffer()
    buffer = model.scale
    ipd.audit(model, torch.randn(2, 4))
    assert model.scale is buffer and buffer.requires_grad is False
