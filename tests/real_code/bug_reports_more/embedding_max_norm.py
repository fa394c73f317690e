"""nn.Embedding(max_norm=...) renormalizes its weight in place inside the forward.

Source: https://github.com/pytorch/pytorch/issues/26596 ("nn.Embedding with max_norm shows unstable
behavior and causes sometimes runtime error ... The error can be avoided by removing the max_norm
feature or by swapping Line a and Line b"), the program as reported. `embedding(idx)` calls
`torch.embedding_renorm_` on `embedding.weight`, which `embedding.weight @ W.t()` (line a) saved.
The intended program is the one nn.Embedding's docstring gives for this case: "performing a
differentiable operation on Embedding.weight before calling Embedding's forward method requires
cloning Embedding.weight when max_norm is not None" (`a = embedding.weight.clone() @ W.t()`).
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
n, d, m = 3, 5, 7
batch_size = 11

embedding = nn.Embedding(n, d, max_norm=True)
W = torch.randn((m, d), requires_grad=True)
optimizer = torch.optim.Adam(list(embedding.parameters()) + [W], lr=1e-3)

optimizer.zero_grad()
idx = torch.tensor([1, 2])

a = embedding.weight @ W.t()  # <saved>
b = embedding(idx) @ W.t()  # <write>

out = (a.unsqueeze(0) + b.unsqueeze(1))
loss = out.sigmoid().prod()
loss.backward()
optimizer.step()
result = {"loss": loss.detach(), "weight": embedding.weight.detach().clone(), "W": W.detach().clone()}
