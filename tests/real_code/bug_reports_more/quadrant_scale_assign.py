"""Scaling one quadrant of a feature map by a learned weight, by slice assignment into the map.

Source: https://github.com/pytorch/pytorch/issues/1321 (asif07hossain's comment:
"x11[:,:,0:int(w_f/2),0:int(h_f/2)]= x11[:,:,0:int(w_f/2),0:int(h_f/2)]*xx1[0] ... suppose x11 is
a auto grad variable ... RuntimeError: one of the variables needed for gradient computation has been
modified by an inplace operation ... but if i do x11=x11*xx1[0], then no error"). The product saves
its operand, the quadrant of `x11` (the weight `xx1[0]` requires grad), and the assignment writes the
product into that quadrant. `x11 = x11 * xx1[0]` scales the whole map: the intended program keeps
the quadrant-only meaning, out of place (a scale map of ones with the learned weight in the quadrant).
"""
import torch
from torch import nn

torch.manual_seed(0)
conv = nn.Conv2d(2, 3, 3, padding=1)
gate = nn.Linear(4, 2)
x = torch.randn(1, 2, 6, 6)
xx1 = torch.sigmoid(gate(torch.randn(4)))
x11 = conv(x)
w_f, h_f = x11.shape[2], x11.shape[3]
x11[:, :, 0:int(w_f/2), 0:int(h_f/2)] = x11[:, :, 0:int(w_f/2), 0:int(h_f/2)] * xx1[0]  # <write>
loss = x11.square().sum()
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in conv.named_parameters()}, **{f"gate.{n}": p.grad for n, p in gate.named_parameters()}}
