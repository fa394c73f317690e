"""A NumPy in-place write into a saved activation between forward and backward.

Source: `t.detach().numpy()` shares the tensor's memory (the common "create a NumPy array from a
tensor with detach().numpy()" advice, e.g. https://androidkt.com/create-numpy-array-from-pytorch-tensor-using-detach-numpy/),
and autograd only notices writes that bump a version counter (pytorch/pytorch#96852: writes
"in a way that PyTorch doesn't know about" need `torch.autograd.graph.increment_version`).
Here the array is rescaled in place for a plot; sigmoid's backward then reads the halved values.
"""
import torch

x = torch.randn(8, requires_grad=True)
s = torch.sigmoid(x)  # expect-saved: IPD109
a = s.detach().numpy()  # expect: IPD109
a *= 0.5  # "normalise for display"
s.sum().backward()  # no error, wrong x.grad
