"""An EMA-style `.data` update of a weight between forward and backward: the weight was saved."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    target = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    loss = model(torch.randn(3, 4)).sum()  # expect-saved: IPD104
    for p, t in zip(model.parameters(), target.parameters()):
        p.data.mul_(0.99).add_(t.data, alpha=0.01)  # expect: IPD104
    loss.backward()


main()
