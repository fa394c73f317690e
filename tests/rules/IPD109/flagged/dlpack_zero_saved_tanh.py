"""The DLPack variant: `np.from_dlpack(t)` calls `t.__dlpack__()` and shares the memory.

Source: the same mechanism as pytorch/pytorch#96852 (a consumer that writes a tensor's memory
through a pointer PyTorch handed out bumps no version counter); DLPack is how JAX, CuPy and
NumPy take a tensor zero-copy. Here a NumPy consumer clips the saved tanh output in place.
"""
import numpy as np
import torch

x = torch.randn(6, requires_grad=True)
t = torch.tanh(x)  # expect-saved: IPD109
view = np.from_dlpack(t.detach())  # expect: IPD109
np.clip(view, -0.5, 0.5, out=view)
t.pow(2).sum().backward()
