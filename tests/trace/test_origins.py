"""A flag fix names the line that constructed the `inplace=True` module, found four ways, or none."""

from __future__ import annotations

import torch
from conftest import marker_line
from torch import nn

import inplace_doctor as ipd


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)  # <attribute>

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(torch.sigmoid(self.fc(x)))


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(4, 4),
            nn.Tanh(),
            nn.ReLU(inplace=True),  # <positional>
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def line_of(tag: str) -> int:
    return marker_line(__file__, tag)


def flag_finding(model: nn.Module) -> ipd.Finding:
    (f,) = [f for f in ipd.audit(model, torch.randn(2, 4)).findings if f.code == "IPD101"]
    return f


def test_from_the_owning_class_attribute():
    f = flag_finding(Gate())
    assert f.mutation.origin is not None and (f.mutation.origin.file, f.mutation.origin.line) == (__file__, line_of("attribute"))
    assert "construct `model.act` with inplace=False at" in f.fix and "`self.act = nn.ReLU(inplace=True)`" in f.fix


def test_from_a_sequential_built_in_the_parents_class():
    f = flag_finding(Body())
    assert f.mutation.origin is not None and f.mutation.origin.line == line_of("positional")
    assert "construct `model.body.2`" in f.fix


def test_recorded_when_the_model_is_built_inside_watch():
    with ipd.watch() as session:
        net = nn.Sequential(
            nn.Linear(4, 4),
            nn.Sigmoid(),
            nn.ReLU(inplace=True),  # <recorded>
        )
        try:
            net(torch.randn(2, 4)).sum().backward()
        except RuntimeError:  # PyTorch's own error, as without the tool
            pass
    (f,) = session.findings
    assert f.mutation.origin is not None and f.mutation.origin.line == line_of("recorded")
    assert "construct `net.2` with inplace=False" in f.fix


def test_no_origin_when_the_source_is_ambiguous():
    first = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU(inplace=True))
    second = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.ReLU(inplace=True))  # two candidates in this file
    f = flag_finding(first)
    assert f.mutation.origin is None and f.fix == "set `model.2.inplace = False` (or construct it with inplace=False)"
    assert second is not None
