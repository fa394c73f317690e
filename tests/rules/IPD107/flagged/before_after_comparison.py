"""A before/after check of a training step that compares the weights with themselves."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    before = model.state_dict()
    model(torch.randn(3, 4)).pow(2).mean().backward()
    opt.step()  # expect: IPD107
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]  # expect-read: IPD107
    assert changed == [], changed  # the "snapshot" moved with the weights


main()
