"""PyTorch 0.4's migration guide, quoted in pytorch/pytorch#6990: "Any changes on x.data wouldn't be
tracked by autograd, and the computed gradients would be incorrect if x is needed in a backward pass".
Here nothing saved is changed: the factor 2 is simply missing from fc's gradient."""
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.data.mul_(2)  # expect: IPD110
        return self.head(h)  # expect-read: IPD110


torch.manual_seed(0)
Scaled()(torch.randn(4, 8)).sum().backward()
