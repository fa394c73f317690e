"""The flagged tempered attention with the fix applied: the temperature is annealed after backward,
so forward and recompute read the same value."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class TemperedAttention(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.qk = nn.Linear(d, d)
        self.register_buffer("temperature", torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.qk(x) @ x.transpose(-1, -2)
        return torch.softmax(scores / self.temperature, dim=-1) @ x


def main() -> None:
    torch.manual_seed(0)
    attn = TemperedAttention()
    for _ in range(2):
        x = torch.randn(2, 5, 8, requires_grad=True)
        loss = checkpoint(attn, x, use_reentrant=False).pow(2).mean()
        loss.backward()
        attn.temperature.mul_(0.9)  # after backward: the next step's forward reads it


main()
