"""An EMA that keeps its source's `state_dict()` as a live view (BigGAN's `ema` class) and reads it
by arithmetic into its own weights each step: the view is meant to track the live weights."""
import copy

import torch
from torch import nn


class EMA:
    def __init__(self, source: nn.Module, target: nn.Module, decay: float = 0.9) -> None:
        self.source_dict = source.state_dict()
        self.target_dict = target.state_dict()
        self.decay = decay

    def update(self) -> None:
        with torch.no_grad():
            for key in self.source_dict:
                if self.source_dict[key].is_floating_point():
                    self.target_dict[key].data.copy_(
                        self.target_dict[key].data * self.decay + self.source_dict[key].data * (1 - self.decay)
                    )
            for key in self.source_dict:
                if self.source_dict[key].is_floating_point():
                    self.target_dict[key].mul_(self.decay).add_(self.source_dict[key], alpha=1 - self.decay)
            torch._foreach_lerp_(list(self.target_dict.values())[:2], list(self.source_dict.values())[:2], 0.5)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    ema_model = copy.deepcopy(model)
    ema = EMA(model, ema_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        ema.update()
    ema_model.eval()(torch.randn(2, 4))


main()
