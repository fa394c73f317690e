"""`.numpy()` after backward, then written: backward already read the saved tensor.

Source: the common "visualise the activations after the training step" pattern
(https://androidkt.com/create-numpy-array-from-pytorch-tensor-using-detach-numpy/).
"""
import torch

x = torch.randn(8, requires_grad=True)
s = torch.sigmoid(x)
s.sum().backward()
a = s.detach().numpy()
a *= 0.5
