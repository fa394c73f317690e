"""Sharpness-Aware Minimization as davda54/sam writes it, driven by its example/train.py.

- `SAM`: sam.py at HEAD. `first_step` (under no_grad) climbs to `w + e(w)` with `p.add_(e_w)` and
  keeps `e_w` in the optimizer state; `second_step` comes back with `p.sub_(e_w)` and runs the
  base optimizer's step.
- `SAMOldP`: sam.py of 2021 (the ASAM version, `adaptive=True`): `first_step` keeps
  `self.state[p]["old_p"] = p.data.clone()`, `second_step` restores with `p.data = old_p` (the
  parameter's data swapped for the clone, not copied into), and the closure form `step(closure)`.
- `WideResNet`: example/model/wide_res_net.py (BatchNorm -> ReLU(inplace=True) -> Conv, the
  `nn.Dropout(dropout, inplace=True)` between the convolutions, zero-initialised classifier),
  depth 10 and width 1 here.
- `smooth_crossentropy`: example/model/smooth_cross_entropy.py (`one_hot.scatter_` on a
  `full_like` of the predictions), `enable_running_stats`/`disable_running_stats`:
  example/utility/bypass_bn.py (BatchNorm momentum set to 0 for the second pass).

Run as a script it trains 2 steps with each optimizer form.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm


class SAM(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"

        defaults = dict(rho=rho, **kwargs)
        super(SAM, self).__init__(params, defaults)

        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)

            for p in group["params"]:
                if p.grad is None: continue
                e_w = p.grad * scale.to(p)
                p.add_(e_w)  # climb to the local maximum "w + e(w)"
                self.state[p]["e_w"] = e_w

        if zero_grad: self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None: continue
                p.sub_(self.state[p]["e_w"])  # get back to "w" from "w + e(w)"  # <sam-sub>

        self.base_optimizer.step()  # do the actual "sharpness-aware" update

        if zero_grad: self.zero_grad()

    def step(self, closure=None):
        raise NotImplementedError("SAM doesn't work like the other optimizers, you should first call `first_step` and the `second_step`; see the documentation for more info.")

    def _grad_norm(self):
        shared_device = self.param_groups[0]["params"][0].device  # put everything on the same device, in case of model parallelism
        norm = torch.norm(
                    torch.stack([
                        p.grad.norm(p=2).to(shared_device)
                        for group in self.param_groups for p in group["params"]
                        if p.grad is not None
                    ]),
                    p=2
               )
        return norm


class SAMOldP(torch.optim.Optimizer):
    def __init__(self, params, base_optimizer, rho=0.05, adaptive=False, **kwargs):
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"

        defaults = dict(rho=rho, adaptive=adaptive, **kwargs)
        super(SAMOldP, self).__init__(params, defaults)

        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)

            for p in group["params"]:
                if p.grad is None: continue
                self.state[p]["old_p"] = p.data.clone()
                e_w = (torch.pow(p, 2) if group["adaptive"] else 1.0) * p.grad * scale.to(p)
                p.add_(e_w)  # climb to the local maximum "w + e(w)"

        if zero_grad: self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None: continue
                p.data = self.state[p]["old_p"]  # get back to "w" from "w + e(w)"

        self.base_optimizer.step()  # do the actual "sharpness-aware" update  # <sam-old-p-base-step>

        if zero_grad: self.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure, but it was not provided"
        closure = torch.enable_grad()(closure)  # the closure should do a full forward-backward pass

        self.first_step(zero_grad=True)
        closure()
        self.second_step()

    def _grad_norm(self):
        shared_device = self.param_groups[0]["params"][0].device  # put everything on the same device, in case of model parallelism
        norm = torch.norm(
                    torch.stack([
                        ((torch.abs(p) if group["adaptive"] else 1.0) * p.grad).norm(p=2).to(shared_device)
                        for group in self.param_groups for p in group["params"]
                        if p.grad is not None
                    ]),
                    p=2
               )
        return norm


class BasicUnit(nn.Module):
    def __init__(self, channels: int, dropout: float):
        super(BasicUnit, self).__init__()
        self.block = nn.Sequential(OrderedDict([
            ("0_normalization", nn.BatchNorm2d(channels)),
            ("1_activation", nn.ReLU(inplace=True)),
            ("2_convolution", nn.Conv2d(channels, channels, (3, 3), stride=1, padding=1, bias=False)),
            ("3_normalization", nn.BatchNorm2d(channels)),
            ("4_activation", nn.ReLU(inplace=True)),
            ("5_dropout", nn.Dropout(dropout, inplace=True)),  # <wrn-dropout>
            ("6_convolution", nn.Conv2d(channels, channels, (3, 3), stride=1, padding=1, bias=False)),
        ]))

    def forward(self, x):
        return self.block(x)


class DownsampleUnit(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, dropout: float):
        super(DownsampleUnit, self).__init__()
        self.norm_act = nn.Sequential(OrderedDict([
            ("0_normalization", nn.BatchNorm2d(in_channels)),
            ("1_activation", nn.ReLU(inplace=True)),
        ]))
        self.block = nn.Sequential(OrderedDict([
            ("0_convolution", nn.Conv2d(in_channels, out_channels, (3, 3), stride=stride, padding=1, bias=False)),
            ("1_normalization", nn.BatchNorm2d(out_channels)),
            ("2_activation", nn.ReLU(inplace=True)),
            ("3_dropout", nn.Dropout(dropout, inplace=True)),
            ("4_convolution", nn.Conv2d(out_channels, out_channels, (3, 3), stride=1, padding=1, bias=False)),
        ]))
        self.downsample = nn.Conv2d(in_channels, out_channels, (1, 1), stride=stride, padding=0, bias=False)

    def forward(self, x):
        x = self.norm_act(x)
        return self.block(x) + self.downsample(x)


class Block(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, depth: int, dropout: float):
        super(Block, self).__init__()
        self.block = nn.Sequential(
            DownsampleUnit(in_channels, out_channels, stride, dropout),
            *(BasicUnit(out_channels, dropout) for _ in range(depth))
        )

    def forward(self, x):
        return self.block(x)


class WideResNet(nn.Module):
    def __init__(self, depth: int, width_factor: int, dropout: float, in_channels: int, labels: int):
        super(WideResNet, self).__init__()

        self.filters = [4, 1 * 4 * width_factor, 2 * 4 * width_factor, 4 * 4 * width_factor]  # 16 in the original
        self.block_depth = (depth - 4) // (3 * 2)

        self.f = nn.Sequential(OrderedDict([
            ("0_convolution", nn.Conv2d(in_channels, self.filters[0], (3, 3), stride=1, padding=1, bias=False)),
            ("1_block", Block(self.filters[0], self.filters[1], 1, self.block_depth, dropout)),
            ("2_block", Block(self.filters[1], self.filters[2], 2, self.block_depth, dropout)),
            ("3_block", Block(self.filters[2], self.filters[3], 2, self.block_depth, dropout)),
            ("4_normalization", nn.BatchNorm2d(self.filters[3])),
            ("5_activation", nn.ReLU(inplace=True)),
            ("6_pooling", nn.AvgPool2d(kernel_size=2)),  # 8 for 32x32 CIFAR images
            ("7_flattening", nn.Flatten()),
            ("8_classification", nn.Linear(in_features=self.filters[3], out_features=labels)),
        ]))

        self._initialize()

    def _initialize(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight.data, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    m.bias.data.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.weight.data.zero_()
                m.bias.data.zero_()

    def forward(self, x):
        return self.f(x)


def smooth_crossentropy(pred, gold, smoothing=0.1):
    n_class = pred.size(1)

    one_hot = torch.full_like(pred, fill_value=smoothing / (n_class - 1))
    one_hot.scatter_(dim=1, index=gold.unsqueeze(1), value=1.0 - smoothing)
    log_prob = F.log_softmax(pred, dim=1)

    return F.kl_div(input=log_prob, target=one_hot, reduction='none').sum(-1)


def disable_running_stats(model):
    def _disable(module):
        if isinstance(module, _BatchNorm):
            module.backup_momentum = module.momentum
            module.momentum = 0

    model.apply(_disable)


def enable_running_stats(model):
    def _enable(module):
        if isinstance(module, _BatchNorm) and hasattr(module, "backup_momentum"):
            module.momentum = module.backup_momentum

    model.apply(_enable)


FORMS = ["sam", "sam_old_p", "asam_old_p", "sam_closure"]


def build(form: str = "sam", dropout: float = 0.0):
    model = WideResNet(10, 1, dropout, in_channels=3, labels=5)
    base_optimizer = torch.optim.SGD
    if form == "sam":
        optimizer = SAM(model.parameters(), base_optimizer, rho=0.05, lr=0.1, momentum=0.9, weight_decay=0.0005)
    else:
        adaptive = form == "asam_old_p"
        optimizer = SAMOldP(model.parameters(), base_optimizer, rho=2.0 if adaptive else 0.05, adaptive=adaptive,
                            lr=0.1, momentum=0.9, weight_decay=0.0005)
    return {"model": model, "optimizer": optimizer, "form": form, "losses": []}


def train(objs, steps: int = 2):
    """example/train.py's inner loop (two forward-backward passes per batch)."""
    model, optimizer = objs["model"], objs["optimizer"]
    model.train()
    for _ in range(steps):
        inputs, targets = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        if objs["form"] == "sam_closure":  # README's closure form: the second pass inside step()
            def closure():
                disable_running_stats(model)
                loss = smooth_crossentropy(model(inputs), targets).mean()
                loss.backward()
                return loss

            enable_running_stats(model)
            loss = smooth_crossentropy(model(inputs), targets).mean()
            loss.backward()
            optimizer.step(closure)
            optimizer.zero_grad()
            objs["losses"].append(loss.detach().clone())
            continue

        # first forward-backward step
        enable_running_stats(model)
        predictions = model(inputs)
        loss = smooth_crossentropy(predictions, targets)
        loss.mean().backward()
        optimizer.first_step(zero_grad=True)

        # second forward-backward step
        disable_running_stats(model)
        second = smooth_crossentropy(model(inputs), targets).mean()
        second.backward()
        optimizer.second_step(zero_grad=True)

        with torch.no_grad():
            correct = torch.argmax(predictions.data, 1) == targets
            objs["losses"].extend([loss.detach().clone(), second.detach().clone(), correct.clone()])
    return objs["losses"]


def train_restoring_before_backward(objs):
    """HAZARD: the second pass's loss is computed at `w + e(w)`, but `second_step` (which
    restores `w`, then steps) runs before its backward: backward needs the perturbed weights that
    the forward saved. The base step then finds no gradient (zero_grad set them to None) and the
    backward below leaves the gradient at the perturbed point in .grad for the next batch."""
    model, optimizer = objs["model"], objs["optimizer"]
    model.train()
    inputs, targets = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    enable_running_stats(model)
    smooth_crossentropy(model(inputs), targets).mean().backward()
    optimizer.first_step(zero_grad=False)
    disable_running_stats(model)
    second = smooth_crossentropy(model(inputs), targets).mean()
    optimizer.second_step(zero_grad=False)  # <sam-restore-too-early>
    second.backward()
    return objs


def modules(objs) -> tuple:
    return (objs["model"],)


def main() -> None:
    torch.set_num_threads(1)
    for form in FORMS:
        torch.manual_seed(0)
        train(build(form))
        print("sam", form, "ok")


if __name__ == "__main__":
    main()
