"""Score-CAM's `denormalize` for plotting, on a tensor that requires grad.

Source: https://github.com/haofanwang/Score-CAM/issues/28 (utils/__init__.py line 173,
`channel.mul_(std).add_(mean)`: "RuntimeError: Output 0 of UnbindBackward is a view and is being
modified inplace"; also paarthneekhara/AdversarialDeepFakes#23 for torchvision's old
`t.sub_(m).div_(s)`). Iterating over `denormalized[0]` unbinds it into per-channel views; the loop
then writes each view in place, meaning to denormalize `denormalized` channel by channel.
Intended program: the thread's own fix (hayleeXinyi), which writes each channel back by index.
"""
import torch
from torch import nn

torch.manual_seed(0)
means = [0.485, 0.456, 0.406]
stds = [0.229, 0.224, 0.225]


def denormalize(tensor):
    denormalized = tensor.clone()

    for channel, mean, std in zip(denormalized[0], means, stds):  # <views>
        channel.mul_(std).add_(mean)  # <write>

    return denormalized


conv = nn.Conv2d(3, 3, 1)
input_ = conv(torch.randn(1, 3, 4, 4))  # an input that requires grad, as in Score-CAM's call
image = denormalize(input_)
loss = image.square().sum()
loss.backward()
result = {"image": image.detach(), "loss": loss.detach(), **{n: p.grad for n, p in conv.named_parameters()}}
