"""A temperature buffer annealed in place between forward and backward: the checkpoint's recompute
reads the new temperature, the gradients are those of another softmax.

Where the pattern comes from: schedules updated "right after the forward" (temperature, EMA decay,
loss scales kept as module buffers) in training loops; with a checkpointed module reading them, the
recompute during backward sees the updated value (the checkpoint docs' requirement that the region
compute the same thing twice; pytorch/pytorch#32005, albanD: the function must not have side effects).
"""
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
        return torch.softmax(scores / self.temperature, dim=-1) @ x  # expect: IPD111


def main() -> None:
    torch.manual_seed(0)
    attn = TemperedAttention()
    x = torch.randn(2, 5, 8, requires_grad=True)
    y = checkpoint(attn, x, use_reentrant=False)
    loss = y.pow(2).mean()
    attn.temperature.mul_(0.9)  # annealed "after the step's forward", before backward
    loss.backward()


main()
