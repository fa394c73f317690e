"""`torch.cat([h, act(h)])`: the concatenation reads h after the in-place activation."""
import torch
from torch import nn


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a = nn.functional.leaky_relu(h, 0.1, inplace=True)  # expect: IPD105
        return torch.cat([h, a], dim=1)  # expect-read: IPD105


def main() -> None:
    torch.manual_seed(0)
    Concat()(torch.randn(4, 8)).sum().backward()


main()
