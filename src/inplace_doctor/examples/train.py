"""A small training script for `inplace-doctor run` (and for trying the tool).

    python -m inplace_doctor.examples.train --steps 100           # clean: ReLU after Linear
    python -m inplace_doctor.examples.train --broken --steps 5    # ReLU(inplace=True) after Sigmoid: backward raises
    inplace-doctor run -m inplace_doctor.examples.train --broken  # the same, diagnosed with both culprits

It prints its arguments (`argv: [...]`) and the loss every `--every` steps, so
a wrapper's effect on its arguments and output can be checked.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, broken: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.gate = nn.Sigmoid() if broken else nn.Identity()
        self.act = nn.ReLU(inplace=True)  # after Sigmoid it overwrites Sigmoid's saved output
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.gate(self.fc1(x))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=10, help="print the loss every N steps")
    parser.add_argument("--broken", action="store_true")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("extra", nargs="*", help="ignored; printed with argv")
    ns = parser.parse_args(argv)
    print(f"argv: {sys.argv[1:] if argv is None else argv}")
    torch.manual_seed(0)
    model = Net(ns.broken)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(ns.batch, 32), torch.randn(ns.batch, 1)
    for step in range(1, ns.steps + 1):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % ns.every == 0 or step == ns.steps:
            print(f"step {step}: loss {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
