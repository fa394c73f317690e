"""Two losses backpropagated through one retained, checkpointed graph, with an optimizer step in
between: the second backward's recompute reads the updated weights.

Without checkpointing, PyTorch raises ("one of the variables needed for gradient computation has been
modified by an inplace operation": the Linear saved its weight). Inside a non-reentrant checkpoint the
weight is not saved but re-read by the recompute, and PyTorch checks only shapes: the second loss's
gradients are silently taken through the new weights. The two-backward-with-a-step-between pattern is
the one of pytorch/pytorch#39141 (`rec_loss.backward(retain_graph=True)`, then `optimizerG.step()`,
then another backward through the same graph: PyTorch raised there, without checkpointing).
"""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))  # expect: IPD111


def main() -> None:
    torch.manual_seed(0)
    block = Block()
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=True)
    out = checkpoint(block, x, use_reentrant=False)
    out.pow(2).mean().backward(retain_graph=True)
    opt.step()  # updates block.fc before the second loss's backward
    out.abs().mean().backward()


main()
