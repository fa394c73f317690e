"""Writing in place to an `expand()`ed tensor: several elements share one memory location."""
import torch

x = torch.randn(1, 4, requires_grad=True)
y = (x * 2).expand(3, 4)
y.add_(1)  # expect: IPD103
