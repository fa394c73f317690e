"""vq-vae-2-pytorch's ResBlock: an in-place ReLU first in the residual stack, then `out += input`.

Source: https://github.com/rosinality/vq-vae-2-pytorch/issues/60 ("since you have `inplace=True`
for the start ReLU, you actually end up getting the latter [post-activation values as the
identity]"; the author: "Definitely it is a bug", fixed in ef5f67c by constructing the first ReLU
without inplace). PyTorch raises nothing: the skip connection silently adds relu(input).
"""
import torch
from torch import nn

torch.manual_seed(0)


class ResBlock(nn.Module):
    def __init__(self, in_channel, channel):
        super().__init__()

        self.conv = nn.Sequential(
            nn.ReLU(inplace=True),  # <origin>
            nn.Conv2d(in_channel, channel, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channel, in_channel, 1),
        )

    def forward(self, input):
        out = self.conv(input)  # <write>
        out += input  # <read>

        return out


class Encoder(nn.Module):
    def __init__(self, in_channel=3, channel=8, n_res_block=2, n_res_channel=4):
        super().__init__()
        blocks = [nn.Conv2d(in_channel, channel, 3, padding=1)]
        for i in range(n_res_block):
            blocks.append(ResBlock(channel, n_res_channel))
        blocks.append(nn.ReLU(inplace=True))
        self.blocks = nn.Sequential(*blocks)

    def forward(self, input):
        return self.blocks(input)


enc = Encoder()
out = enc(torch.randn(2, 3, 6, 6))
loss = out.square().mean()
loss.backward()
result = {"out": out.detach(), **{n: p.grad for n, p in enc.named_parameters()}}
