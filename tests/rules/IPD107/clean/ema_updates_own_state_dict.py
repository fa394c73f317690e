"""An EMA (timm's ModelEmaV2 style) updating its own `state_dict()` values in place: the holder's intent."""
import copy

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    ema = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        with torch.no_grad():
            for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
                if e.dtype.is_floating_point:
                    e.copy_(e * 0.99 + m * 0.01)
                else:
                    e.copy_(m)
    ema(torch.randn(5, 4))


main()
