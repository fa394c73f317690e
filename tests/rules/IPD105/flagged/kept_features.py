"""A list of features kept before the activation, which then runs in place on them."""
import torch
from torch import nn


class Pyramid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = []
        for layer in self.layers:
            x = layer(x)
            feats.append(x)
            x = self.act(x)  # expect: IPD105
        return torch.stack(feats).sum(0) + x  # expect-read: IPD105


torch.manual_seed(0)
Pyramid()(torch.randn(4, 8)).sum().backward()
