"""The before/after check with cloned tensors: `{k: v.detach().clone()}`."""
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model(torch.randn(3, 4)).pow(2).mean().backward()
    opt.step()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == 4, changed


main()
