# mypy: ignore-errors
"""In-place ops inside torch.utils.checkpoint give exact gradients; in-place on a checkpoint's input raises."""

import torch
import torch.utils.checkpoint as cp
from torch import nn

CLAIM = "in-place ops inside activation checkpointing give silently wrong gradients"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    def grads(use_cp: bool, reentrant: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        block = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
        out = cp.checkpoint(block, x, use_reentrant=reentrant) if use_cp else block(x)
        out.sum().backward()
        return [x.grad] + [p.grad for p in block.parameters()]

    ref = grads(False, False)
    exact = all(all(torch.equal(a, b) for a, b in zip(ref, grads(True, r))) for r in (False, True))

    def touch_input(t: torch.Tensor) -> torch.Tensor:
        return t.mul_(2).sin()

    w = torch.randn(4, requires_grad=True)
    try:
        cp.checkpoint(touch_input, w * 1, use_reentrant=False).sum().backward()
        raised = False
    except RuntimeError:
        raised = True
    return (f"conv-bn-relu_ inside checkpoint, reentrant and not: grads bitwise exact: {exact}; "
            f"in-place on the checkpoint's input raises: {raised}", "FALSE" if exact else "TRUE")
