"""Writing one element of a sigmoid's output by index assignment, `b[1] = 2`.

Source: https://github.com/pytorch/pytorch/issues/9391 ("backward pass different behaviors with
inplace operation": `b = a.sigmoid(); b[1] = 2; b.sum().backward()` raises, while the same values
computed as `1/((-a).exp()+1)` do not). `sigmoid` saves its output for backward (SigmoidBackward0
uses `result`); the assignment overwrites an element of that output. The intended program sets the
element out of place (`torch.where`), which gives element 1 a zero gradient, as the thread expects.
"""
import torch

torch.manual_seed(0)
a = torch.tensor([1, 2, 3.], requires_grad=True)
b = a.sigmoid()  # <saved>
b[1] = 2  # <write>
b.sum().backward()
result = {"b": b.detach(), "a.grad": a.grad}
