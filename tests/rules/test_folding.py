"""Occurrences folded into one finding: a second fix is added when its records differ, never by its words.

One line that writes several parameters (a manual SGD update under `no_grad`) is one
finding whose `places` name each parameter; their fixes are the same edit of the same
line, so the finding carries one fix, however its sentence names the parameter. A module's
`inplace` flag differs per module: each module folded in keeps its own fix.
"""

from __future__ import annotations

import torch
from torch import nn

import inplace_doctor as ipd


def test_one_update_line_over_several_parameters_is_one_finding_with_one_fix() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 4), nn.Sigmoid(),
                          nn.Linear(4, 1))
    with ipd.watch(model) as session:
        x = torch.randn(2, 4)
        first = model(x).sum()
        second = model(x).pow(2).sum()  # its graph saves the weights the update below overwrites
        first.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(0.1 * p.grad)
    (finding,) = session.findings
    assert finding.code == "IPD101" and finding.places == ("model.2.weight", "model.4.weight", "model.6.weight")
    assert finding.fix_alternatives == ()  # the sentence names one parameter; the places name all three
    assert "fixes" not in finding.details
    del second


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.Sigmoid()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.act(self.lin(x)))


def test_each_module_whose_flag_is_the_fix_keeps_its_own_fix() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(2)])
    report = ipd.audit(model, torch.randn(2, 4))
    (finding,) = [f for f in report.findings if f.code == "IPD101"]
    assert finding.count == 2
    (other,) = finding.fix_alternatives  # one per module: `model.0.relu`, `model.1.relu`
    assert {"`model.0.relu.inplace = False`" in s for s in (finding.fix, other)} == {True, False}
    assert {"`model.1.relu.inplace = False`" in s for s in (finding.fix, other)} == {True, False}
