"""The flagged feed-forward block with preserve_rng_state=True (the default): the recompute replays the
forward's RNG state and draws the same dropout mask (allenai/OLMo#702, allenai/OLMo-core#828's fix)."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class FeedForward(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.up(x))
        return x + self.drop(self.down(h))


def main() -> None:
    torch.manual_seed(0)
    block = FeedForward()
    x = torch.randn(4, 16, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False, preserve_rng_state=True)
    y.pow(2).mean().backward()


main()
