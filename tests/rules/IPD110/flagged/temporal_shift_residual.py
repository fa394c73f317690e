"""TSM's in-place temporal shift (mit-han-lab/temporal-shift-module, `InplaceShift`), wrapped around a
residual block's first conv: the Function's own output and the conv it feeds get their gradient
through the Function's backward, which shifts it back; the residual `out += identity` reads the
shifted values as if they were the block's input, and its gradient follows the unshifted history."""
import torch
from torch import nn


class ShiftLeft(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fold):
        ctx.fold = fold
        buffer = torch.zeros_like(x.data[:, :, :fold])
        buffer[:, :-1] = x.data[:, 1:, :fold]
        x.data[:, :, :fold] = buffer  # expect: IPD110
        return x

    @staticmethod
    def backward(ctx, grad):
        fold = ctx.fold
        shifted = torch.zeros_like(grad[:, :, :fold])
        shifted[:, 1:] = grad[:, :-1, :fold]
        grad = grad.clone()
        grad[:, :, :fold] = shifted
        return grad, None


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        nt, c, h, w = x.shape
        shifted = ShiftLeft.apply(x.view(nt // 4, 4, c, h, w), 2).view(nt, c, h, w)
        out = self.conv2(torch.relu(self.conv1(shifted)))
        out += identity  # expect-read: IPD110
        return out


torch.manual_seed(0)
stem = nn.Conv2d(3, 8, 3, padding=1)
Block()(stem(torch.randn(8, 3, 6, 6))).mean().backward()
