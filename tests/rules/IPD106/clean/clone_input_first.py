"""The fix: clone the input at the top of forward, then write in place inside."""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[mask] = 0.0
        x.clamp_(-1.0, 1.0)
        return self.fc(x)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, 4:] = True
    Encoder()(x, mask).sum().backward()


main()
