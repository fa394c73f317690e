"""Tacotron 2's attention masks padding through `.data` with -inf before the softmax: softmax's output,
and so the gradient reaching the masked positions, is exactly 0 there, so the gradients equal those
of `scores.masked_fill(mask, -inf)`. Backward clears the prediction (counted as harmless)."""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
query, key = nn.Linear(8, 8), nn.Linear(8, 8)
x = torch.randn(2, 5, 8)
padding = torch.tensor([[False, False, False, True, True], [False, False, False, False, True]])
scores = torch.bmm(query(x), key(x).transpose(1, 2))
scores.data.masked_fill_(padding[:, None, :], -float("inf"))
attention = F.softmax(scores, dim=-1)
torch.bmm(attention, x).pow(2).sum().backward()
