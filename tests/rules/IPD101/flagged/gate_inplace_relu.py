"""A gate whose sigmoid output an nn.ReLU(inplace=True) rectifies: SigmoidBackward0 needs it."""
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.fc(x))  # expect-saved: IPD101
        return self.act(gate)  # expect: IPD101


def main() -> None:
    torch.manual_seed(0)
    model = Gate()
    model(torch.randn(2, 8)).sum().backward()


if __name__ == "__main__":
    main()
