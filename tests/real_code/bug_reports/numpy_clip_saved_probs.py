"""A forward that clips its probabilities with NumPy through `.numpy()`, which shares their memory.

Source: https://github.com/pytorch/pytorch/issues/97586 ("Tensor shares memory with numpy array
under certain condition": `np_tensor = tensor.numpy()` and the tensor are one buffer, so a write to
either changes both). In a training step that surprise is silent: the model clips its sigmoid
probabilities away from 0 and 1 in NumPy (`np.clip(..., out=arr)`, a common way to keep a log
loss finite), which writes the very tensor `SigmoidBackward0` saved. No op runs, no version moves:
backward raises nothing and computes sigmoid's gradient from the clipped values. Two SGD steps.
The intended program clips out of place in PyTorch (`probs.clamp(0.05, 0.95)`).
"""
import numpy as np
import torch
from torch import nn

torch.manual_seed(0)


def keep_finite(arr):
    np.clip(arr, 0.05, 0.95, out=arr)  # <write>


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        probs = torch.sigmoid(self.head(h))  # <saved>
        keep_finite(probs.detach().numpy())  # <handout>
        return probs


model = Scorer()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 6) * 30
y = (torch.rand(16, 1) > 0.5).float()
for step in range(2):
    optimizer.zero_grad()
    probs = model(x)
    loss = -(y * probs.log() + (1 - y) * (1 - probs).log()).mean()
    loss.backward()
    optimizer.step()
result = {"loss": loss.detach(), **{n: p.detach().clone() for n, p in model.named_parameters()}}
