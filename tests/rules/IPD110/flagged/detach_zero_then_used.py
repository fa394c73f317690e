"""pytorch/pytorch#7860 ("`.data` and `.detach`"), as reported: zeroing `x.detach()` changes `x`,
and `(x * y).sum().backward()` then gives `a.grad` and `b.grad` as if `x` were still `a * b`."""
import torch

a = torch.tensor([1.0, 2.0], requires_grad=True)
b = torch.tensor([2.0, 3.0], requires_grad=True)
y = torch.tensor([1.0, 1.0], requires_grad=True)
x = a * b
x.detach().zero_()  # expect: IPD110
out = (x * y).sum()  # expect-read: IPD110
out.backward()
