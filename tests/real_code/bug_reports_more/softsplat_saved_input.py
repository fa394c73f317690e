"""A custom autograd.Function that saves its inputs (softmax-splatting's `_FunctionSoftsplat`), one of
which the network then rectifies in place.

Source: https://github.com/sniklaus/softmax-splatting/issues/50 ("I got an error as the title when
call loss.backward, I fixed it when I changed self.save_for_backward(tenIn, tenFlow) into
self.save_for_backward(tenIn.clone(), tenFlow.clone())"; the maintainer asks "What is the layer
before and the layer after the softmax splatting in your network?"). The report does not show the
layers; here the layer after is a `ReLU(inplace=True)` on the splatted features' input, which the
Function saved. The splatting is cut to a differentiable shift by the mean flow (the CUDA kernel's
place), with a hand-written backward that reads both saved inputs. The intended program: the ReLU
out of place (the Function unchanged, no copies of what it saves).
"""
import torch
from torch import nn

torch.manual_seed(0)


class _FunctionSoftsplat(torch.autograd.Function):
    @staticmethod
    def forward(self, tenIn, tenFlow):
        self.save_for_backward(tenIn, tenFlow)  # <saved>
        weight = tenFlow.mean(1, keepdim=True).sigmoid()
        return tenIn * weight

    @staticmethod
    def backward(self, tenOutgrad):
        tenIn, tenFlow = self.saved_tensors
        weight = tenFlow.mean(1, keepdim=True).sigmoid()
        tenIngrad = tenOutgrad * weight
        dweight = (tenOutgrad * tenIn).sum(1, keepdim=True) * weight * (1 - weight)
        tenFlowgrad = dweight.expand_as(tenFlow) / tenFlow.shape[1]
        return tenIngrad, tenFlowgrad


def softsplat(tenIn, tenFlow):
    return _FunctionSoftsplat.apply(tenIn, tenFlow)  # <apply>


class Synthesis(nn.Module):
    def __init__(self):
        super().__init__()
        self.netFeat = nn.Conv2d(3, 4, 3, padding=1)
        self.netFlow = nn.Conv2d(3, 2, 3, padding=1)
        self.netAfter = nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding=1))  # <origin>
        self.netOut = nn.Conv2d(8, 3, 1)

    def forward(self, tenOne):
        tenFeat = self.netFeat(tenOne)
        tenFlow = self.netFlow(tenOne)
        tenWarped = softsplat(tenFeat, tenFlow)
        tenSkip = self.netAfter(tenFeat)  # <write>
        return self.netOut(torch.cat([tenWarped, tenSkip], 1))


net = Synthesis()
out = net(torch.randn(2, 3, 6, 6))
loss = out.square().mean()
loss.backward()
result = {"loss": loss.detach(), **{n: p.grad for n, p in net.named_parameters()}}
