"""An in-place accumulation inside a checkpointed region: the recompute adds again."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]  # expect: IPD108
        return torch.tanh(self.fc(x))


torch.manual_seed(0)
layer = Counting()
x = torch.randn(3, 4, requires_grad=True)
checkpoint(layer, x, use_reentrant=False).sum().backward()
