"""Lookahead ("k steps forward, 1 step back") wrappers as their authors wrote them.

- `LookaheadZhang`: michaelrzhang/lookahead lookahead_pytorch.py (the paper's first author): the
  slow weights cached with `copy_(p.data)`; every `la_steps` inner steps
  `p.data.mul_(la_alpha).add_(1.0 - la_alpha, cached)` (the deprecated `add_(Number, Tensor)`
  overload, as written) then `cached.copy_(p.data)`; `pullback_momentum` "pullback" interpolates
  SGD's `momentum_buffer` in place, "reset" replaces it; the README's evaluation on the slow
  weights: `_backup_and_load_cache()`, eval, `_clear_and_load_backup()` (`p.data.copy_` both ways).
- `LookaheadTimm`: timm/optim/lookahead.py (`@torch.no_grad()` step; every k steps
  `slow.add_(fast_p - slow, alpha=lookahead_alpha)` then `fast_p.copy_(slow)`, no `.data`), and
  its `sync_lookahead()`, which timm train.py calls after each epoch before validating.

Run as a script it trains 5 steps with each.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import Optimizer


class LookaheadZhang(Optimizer):
    def __init__(self, optimizer, la_steps=5, la_alpha=0.8, pullback_momentum="none"):
        self.optimizer = optimizer
        self._la_step = 0  # counter for inner optimizer
        self.la_alpha = la_alpha
        self._total_la_steps = la_steps
        pullback_momentum = pullback_momentum.lower()
        assert pullback_momentum in ["reset", "pullback", "none"]
        self.pullback_momentum = pullback_momentum

        self.state = defaultdict(dict)

        # Cache the current optimizer parameters
        for group in optimizer.param_groups:
            for p in group['params']:
                param_state = self.state[p]
                param_state['cached_params'] = torch.zeros_like(p.data)
                param_state['cached_params'].copy_(p.data)
                if self.pullback_momentum == "pullback":
                    param_state['cached_mom'] = torch.zeros_like(p.data)

    def zero_grad(self):
        self.optimizer.zero_grad()

    def _backup_and_load_cache(self):
        """Useful for performing evaluation on the slow weights (which typically generalize better)
        """
        for group in self.optimizer.param_groups:
            for p in group['params']:
                param_state = self.state[p]
                param_state['backup_params'] = torch.zeros_like(p.data)
                param_state['backup_params'].copy_(p.data)
                p.data.copy_(param_state['cached_params'])  # <zhang-load-cache>

    def _clear_and_load_backup(self):
        for group in self.optimizer.param_groups:
            for p in group['params']:
                param_state = self.state[p]
                p.data.copy_(param_state['backup_params'])
                del param_state['backup_params']

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self._la_step += 1

        if self._la_step >= self._total_la_steps:
            self._la_step = 0
            # Lookahead and cache the current optimizer parameters
            for group in self.optimizer.param_groups:
                for p in group['params']:
                    param_state = self.state[p]
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)  # add_(Number, Tensor) is deprecated
                        p.data.mul_(self.la_alpha).add_(1.0 - self.la_alpha, param_state['cached_params'])  # crucial line
                    param_state['cached_params'].copy_(p.data)
                    if self.pullback_momentum == "pullback":
                        internal_momentum = self.optimizer.state[p]["momentum_buffer"]
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", UserWarning)
                            self.optimizer.state[p]["momentum_buffer"] = internal_momentum.mul_(self.la_alpha).add_(
                                1.0 - self.la_alpha, param_state["cached_mom"])
                        param_state["cached_mom"] = self.optimizer.state[p]["momentum_buffer"]
                    elif self.pullback_momentum == "reset":
                        self.optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p.data)

        return loss


class LookaheadTimm(Optimizer):
    def __init__(self, base_optimizer, alpha=0.5, k=6):
        # NOTE super().__init__() not called on purpose
        self._optimizer_step_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_step_post_hooks: Dict[int, Callable] = OrderedDict()
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f'Invalid slow update rate: {alpha}')
        if not 1 <= k:
            raise ValueError(f'Invalid lookahead steps: {k}')
        defaults = dict(lookahead_alpha=alpha, lookahead_k=k, lookahead_step=0)
        self._base_optimizer = base_optimizer
        self.param_groups = base_optimizer.param_groups
        self.defaults = base_optimizer.defaults
        self.defaults.update(defaults)
        self.state = defaultdict(dict)
        # manually add our defaults to the param groups
        for name, default in defaults.items():
            for group in self._base_optimizer.param_groups:
                group.setdefault(name, default)

    @torch.no_grad()
    def update_slow(self, group):
        for fast_p in group["params"]:
            if fast_p.grad is None:
                continue
            param_state = self._base_optimizer.state[fast_p]
            if 'lookahead_slow_buff' not in param_state:
                param_state['lookahead_slow_buff'] = torch.empty_like(fast_p)
                param_state['lookahead_slow_buff'].copy_(fast_p)
            slow = param_state['lookahead_slow_buff']
            slow.add_(fast_p - slow, alpha=group['lookahead_alpha'])
            fast_p.copy_(slow)  # <timm-fast-copy>

    def sync_lookahead(self):
        for group in self._base_optimizer.param_groups:
            self.update_slow(group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._base_optimizer.step(closure)
        for group in self._base_optimizer.param_groups:
            group['lookahead_step'] += 1
            if group['lookahead_step'] % group['lookahead_k'] == 0:
                self.update_slow(group)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self._base_optimizer.zero_grad(set_to_none)


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 3))


FORMS = ["zhang_none", "zhang_pullback", "zhang_reset", "timm_copy", "timm_real"]


def build(form: str = "zhang_none"):
    model = net()
    if form.startswith("zhang"):
        inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        optimizer = LookaheadZhang(inner, la_steps=2, la_alpha=0.8, pullback_momentum=form.split("_")[1])
    elif form == "timm_copy":
        optimizer = LookaheadTimm(torch.optim.AdamW(model.parameters(), lr=1e-2), alpha=0.5, k=2)
    else:
        from timm.optim import Lookahead

        optimizer = Lookahead(torch.optim.AdamW(model.parameters(), lr=1e-2), alpha=0.5, k=2)
    return {"model": model, "optimizer": optimizer, "form": form, "losses": []}


def train(objs, steps: int = 5):
    """pytorch/examples-style epoch loop; eval on the slow weights (Zhang's README) or after
    `sync_lookahead()` (timm train.py) at the end of each 'epoch' of 2 batches."""
    model, optimizer = objs["model"], objs["optimizer"]
    for i in range(steps):
        model.train()
        x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        objs["losses"].append(loss.detach().clone())
        if i % 2 == 1:  # end of an epoch: validate
            model.eval()
            if objs["form"].startswith("zhang"):
                optimizer._backup_and_load_cache()
                with torch.no_grad():
                    objs["losses"].append(F.cross_entropy(model(x), y))
                optimizer._clear_and_load_backup()
            else:
                optimizer.sync_lookahead()
                with torch.no_grad():
                    objs["losses"].append(F.cross_entropy(model(x), y))
    return objs["losses"]


def train_evaluating_slow_weights_before_backward(objs):
    """Zhang's README evaluation on the slow weights, placed between a training forward and its
    backward (at the second step, where the fast weights have moved away from the slow ones):
    `p.data.copy_(cached)` then `p.data.copy_(backup)` rewrite weights the forward saved, but put
    back the very same bytes before backward reads them. The gradients are those of the plain step."""
    model, optimizer = objs["model"], objs["optimizer"]
    for i in range(3):
        model.train()
        x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(model(x), y)
        if i == 1:  # log the slow weights' loss on this batch
            objs["slow_differs"] = any(not torch.equal(p, optimizer.state[p]["cached_params"]) for p in model.parameters())
            model.eval()
            optimizer._backup_and_load_cache()
            with torch.no_grad():
                objs["losses"].append(F.cross_entropy(model(x), y))
            optimizer._clear_and_load_backup()
            model.train()
        optimizer.zero_grad()
        loss.backward()
        objs["grads"] = objs.get("grads", []) + [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        objs["losses"].append(loss.detach().clone())
    return objs["losses"]


def train_restoring_after_backward(objs, restore_before_backward: bool = False):
    """HAZARD: the same evaluation on the slow weights with `_clear_and_load_backup()` put after
    `loss.backward()`: backward reads the slow weights `_backup_and_load_cache` wrote through
    `.data` where the forward used the fast ones (silently wrong gradients).
    `restore_before_backward=True` is the correct order, for comparison."""
    model, optimizer = objs["model"], objs["optimizer"]
    for i in range(3):
        model.train()
        x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(model(x), y)
        evaluate = i == 1
        if evaluate:
            optimizer._backup_and_load_cache()
            with torch.no_grad():
                objs["losses"].append(F.cross_entropy(model(x), y))
            if restore_before_backward:
                optimizer._clear_and_load_backup()
        optimizer.zero_grad()
        loss.backward()
        if evaluate and not restore_before_backward:
            optimizer._clear_and_load_backup()
        objs["grads"] = objs.get("grads", []) + [p.grad.clone() for p in model.parameters()]
        optimizer.step()
    return objs


def train_syncing_before_backward(objs):
    """HAZARD: timm's `sync_lookahead()` (slow-weight update and `fast_p.copy_(slow)`) moved
    between the forward and `loss.backward()`: backward needs the weights the forward saved."""
    model, optimizer = objs["model"], objs["optimizer"]
    for i in range(3):
        x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        loss = F.cross_entropy(model(x), y)
        if i == 2:
            optimizer.sync_lookahead()  # <timm-sync-too-early>
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return objs


def modules(objs) -> tuple:
    return (objs["model"],)


def main() -> None:
    torch.set_num_threads(1)
    for form in FORMS[:-1]:
        torch.manual_seed(0)
        train(build(form))
        print("lookahead", form, "ok")


if __name__ == "__main__":
    main()
