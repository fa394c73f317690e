"""Computing with a modified leaf: out of place, or in place on a clone."""
import torch

w = torch.randn(3, requires_grad=True)
shifted = w + 1
masked = w.clone()
masked[0] = 0.0
(shifted * masked).sum().backward()
