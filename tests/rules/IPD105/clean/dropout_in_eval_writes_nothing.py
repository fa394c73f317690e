"""`nn.Dropout(inplace=True)` in eval (or with p=0) returns its input unwritten: a residual that
reads the input again reads the values the out-of-place program reads."""
import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5, inplace=True)
        self.drop_nothing = nn.Dropout(0.0, inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = h + self.drop_nothing(h)
        return h + self.drop(h)


torch.manual_seed(0)
Residual().eval()(torch.randn(4, 8)).sum().backward()
