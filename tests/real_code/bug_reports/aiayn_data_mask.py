"""attention-is-all-you-need-pytorch's ScaledDotProductAttention (2017), masking through `.data`.

Source: https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/16 ("masking on
tensor.data? ... `attn.data.masked_fill_(attn_mask, -float('inf'))` ... shouldn't we assign values
to tensor itself, instead of tensor.data? In this way, the history of the gradient can be
tracked"; the maintainer later "avoided to manipulate on the data"). The write bypasses autograd;
here the -inf before softmax makes the gradient at the masked positions exactly 0, so the gradients
are the out-of-place program's: the tool clears its prediction at backward (a correct program).
"""
import numpy as np
import torch
from torch import nn

torch.manual_seed(0)


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model, attn_dropout=0.0):
        super().__init__()
        self.temper = np.power(d_model, 0.5)
        self.dropout = nn.Dropout(attn_dropout)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q, k, v, attn_mask=None):
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temper

        if attn_mask is not None:
            assert attn_mask.size() == attn.size()
            attn.data.masked_fill_(attn_mask, -float('inf'))  # <write>

        attn = self.softmax(attn)  # <read>
        attn = self.dropout(attn)
        output = torch.bmm(attn, v)

        return output, attn


proj = nn.Linear(6, 6)
attention = ScaledDotProductAttention(6)
x = proj(torch.randn(2, 4, 6))
pad = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 1]], dtype=torch.bool)
attn_mask = pad[:, None, :].expand(2, 4, 4)
out, attn = attention(x, x, x, attn_mask=attn_mask)
loss = out.square().sum()
loss.backward()
result = {"out": out.detach(), **{n: p.grad for n, p in proj.named_parameters()}}
