"""An EMA kept as `state_dict()` values of its own copy, updated with `torch._foreach_lerp_`."""
import copy

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    ema_model = copy.deepcopy(model)
    ema = list(ema_model.state_dict().values())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, list(model.state_dict().values()), 0.1)
    ema_model(torch.randn(3, 4))


main()
