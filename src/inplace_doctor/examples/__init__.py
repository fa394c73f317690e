"""Small models for the README, the docs and the tests: broken ones and their clean look-alikes.

Each is a factory usable from the CLI: `inplace-doctor audit inplace_doctor.examples:sigmoid_then_relu`.
"""

from __future__ import annotations

import torch
from torch import nn


class SigmoidThenReLU(nn.Module):
    """A gate whose sigmoid output is then rectified in place: backward raises (IPD101)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.fc(x))  # SigmoidBackward0 saves its output
        return self.act(gate)  # ... which the in-place ReLU overwrites


class LinearThenReLU(nn.Module):
    """The clean look-alike: Linear saves its input, ReLU saves its own output, in place is safe."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width)
        self.act = nn.ReLU(inplace=True)
        self.out = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.bn(self.fc(x))))


class ResidualSinAdd(nn.Module):
    """`x += f(x)` where f saves x (sin): backward raises (IPD101)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h += torch.sin(h)
        return h


class DataWriteAfterSave(nn.Module):
    """A write through `.data` to a saved activation: gradients silently wrong (IPD104)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        h.data.mul_(0.5)
        return h


class ResidualReLU(nn.Module):
    """`h + relu_(h)`: runs without error but computes `2 * relu(h)` (IPD105; verify names `act`)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h + self.act(h)


def residual_relu() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """CLI factory: the silent residual bug with an example batch."""
    return ResidualReLU(), (torch.randn(4, 8),)


def sigmoid_then_relu() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """CLI factory: the broken gate with an example batch."""
    return SigmoidThenReLU(), (torch.randn(4, 8),)


def linear_then_relu() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """CLI factory: the clean look-alike with an example batch."""
    return LinearThenReLU(), (torch.randn(4, 8),)


def residual_sin_add() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return ResidualSinAdd(), (torch.randn(4, 8),)


def data_write_after_save() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return DataWriteAfterSave(), (torch.randn(4, 8),)


__all__ = [
    "DataWriteAfterSave",
    "LinearThenReLU",
    "ResidualReLU",
    "ResidualSinAdd",
    "SigmoidThenReLU",
    "data_write_after_save",
    "linear_then_relu",
    "residual_relu",
    "residual_sin_add",
    "sigmoid_then_relu",
]
