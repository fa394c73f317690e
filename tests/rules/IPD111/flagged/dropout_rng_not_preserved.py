"""A transformer feed-forward block checkpointed with preserve_rng_state=False: the recompute draws
another dropout mask, so the gradients belong to another sample than the loss.

The pattern as public reports describe it: allenai/OLMo-core#828 (activation checkpointing hardcoded
`preserve_rng_state = False`; with dropout the loss moved by 0.3), ankanbhunia/PIDM#66 ("if
`preserve_rng_state=False`, the dropout will definitely not work"), openai/guided-diffusion#167.
"""
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
        return x + self.drop(self.down(h))  # expect: IPD111


def main() -> None:
    torch.manual_seed(0)
    block = FeedForward()
    x = torch.randn(4, 16, requires_grad=True)
    y = checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
    y.pow(2).mean().backward()


main()
