"""flamingo-pytorch's MaskedCrossAttention, zeroing attention with `masked_fill_` after the softmax.

Source: https://github.com/lucidrains/flamingo-pytorch/issues/10 ("zeroing out attention not
working ... you are not using the inplace version of the function": `attn.masked_fill(...)` at
flamingo_pytorch.py:179 discarded its result). The program is the report's suggestion, the in-place
`masked_fill_`, which overwrites the softmax output SoftmaxBackward0 saved; the maintainer's fix
(10913ab) rebinds out of place: `attn = attn.masked_fill(...)`. (einops' rearrange written as
reshape/transpose/indexing.)
"""
import torch
from torch import einsum, nn

torch.manual_seed(0)


class MaskedCrossAttention(nn.Module):
    def __init__(self, dim=8, dim_head=4, heads=2):
        super().__init__()
        self.scale = dim_head ** -0.5
        self.heads = heads
        inner_dim = dim_head * heads
        self.norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(dim, inner_dim * 2, bias=False)
        self.to_out = nn.Linear(inner_dim, dim, bias=False)

    def forward(self, x, media, text_time):
        b, n, _ = x.shape
        h = self.heads
        x = self.norm(x)
        q = self.to_q(x)
        k, v = self.to_kv(media).chunk(2, dim=-1)
        q, k, v = (t.reshape(b, -1, h, t.shape[-1] // h).transpose(1, 2) for t in (q, k, v))
        q = q * self.scale

        sim = einsum('... i d, ... j d -> ... i j', q, k)
        sim = sim - sim.amax(dim=-1, keepdim=True).detach()
        attn = sim.softmax(dim=-1)  # <saved>

        # any text without a preceding media needs to have attention zeroed out
        text_without_media_mask = text_time == 0
        text_without_media_mask = text_without_media_mask[:, None, :, None]
        attn.masked_fill_(text_without_media_mask, 0.)  # <write>

        out = einsum('... i j, ... j d -> ... i d', attn, v)
        out = out.transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)


attn = MaskedCrossAttention()
x, media = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
text_time = torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, 2, 2]])
out = attn(x, media, text_time)
loss = out.square().sum()
loss.backward()
result = {"out": out.detach(), **{n: p.grad for n, p in attn.named_parameters()}}
