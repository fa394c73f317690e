"""A forward that zeroes padded positions and clamps, in the caller's tensor."""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x[mask] = 0.0  # expect: IPD106
        x.clamp_(-1.0, 1.0)  # expect: IPD106
        return self.fc(x)


def main() -> None:
    torch.manual_seed(0)
    model = Encoder()
    x = torch.randn(4, 6)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, 4:] = True
    model(x, mask).sum().backward()


main()
