"""A NumPy view only read (logging a metric) between forward and backward: nothing changes.

Source: the usual logging idiom, `activation.detach().cpu().numpy()` to compute statistics
(https://androidkt.com/create-numpy-array-from-pytorch-tensor-using-detach-numpy/).
"""
import numpy as np
import torch

x = torch.randn(8, requires_grad=True)
s = torch.sigmoid(x)
a = s.detach().numpy()
mean, spread = float(np.mean(a)), float(np.std(a))
s.sum().backward()
