"""EMA of the weights, in the shape of timm's ModelEmaV2 and ModelEmaV3 and of `train_one_epoch`.

- `EmaV2`: like timm.utils.ModelEmaV2: a deep copy in eval mode; `update` walks
  `self.module.state_dict().values()` alongside `model.state_dict().values()` under no_grad and
  `copy_`s `decay * e + (1 - decay) * m` into every entry (integer buffers included, as timm does).
- `EmaV3`: like timm.utils.ModelEmaV3 (foreach=True): warm-up decay, floating entries of the
  EMA's own state_dict lerped together with `torch._foreach_lerp_`, integer ones `copy_`ed.
- `train` follows timm's train.py `train_one_epoch`: forward, loss, zero_grad, backward,
  clip_grad_norm_, step, then `model_ema.update(model, step=num_updates)`, and a validation pass
  of the EMA copy under no_grad between steps.

Run as a script, it trains with both EMA versions.
"""

from __future__ import annotations

from copy import deepcopy

import torch
import torch.nn.functional as F
from torch import nn


def small_cnn(num_classes: int = 5) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(8, num_classes),
    )


class EmaV2(nn.Module):
    def __init__(self, model: nn.Module, decay: float = 0.9):
        super().__init__()
        self.module = deepcopy(model)
        self.module.eval()
        self.decay = decay

    def _update(self, model, update_fn):
        with torch.no_grad():
            for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
                ema_v.copy_(update_fn(ema_v, model_v))

    def update(self, model, step=None):
        self._update(model, update_fn=lambda e, m: self.decay * e + (1.0 - self.decay) * m)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class EmaV3(nn.Module):
    def __init__(self, model: nn.Module, decay: float = 0.9, min_decay: float = 0.0, warmup_gamma: float = 1.0, warmup_power: float = 2 / 3):
        super().__init__()
        self.module = deepcopy(model)
        self.module.eval()
        self.decay, self.min_decay = decay, min_decay
        self.warmup_gamma, self.warmup_power = warmup_gamma, warmup_power

    def get_decay(self, step=None) -> float:
        if step is None:
            return self.decay
        step = max(0, step - 1)
        if step <= 0:
            return 0.0
        decay = 1 - (1 + step / self.warmup_gamma) ** -self.warmup_power
        return max(min(decay, self.decay), self.min_decay)

    @torch.no_grad()
    def update(self, model, step=None):
        decay = self.get_decay(step)
        ema_lerp, model_lerp = [], []
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema_v.is_floating_point():
                ema_lerp.append(ema_v)
                model_lerp.append(model_v)
            else:
                ema_v.copy_(model_v)
        torch._foreach_lerp_(ema_lerp, model_lerp, weight=1.0 - decay)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def build(version: str = "v2"):
    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    ema_cls = {"v2": EmaV2, "v3": EmaV3}[version]
    return model, optimizer, ema_cls(model)


def build_timm(version: str = "v2"):
    """The same with the real timm classes."""
    from timm.utils import ModelEmaV2, ModelEmaV3

    model = small_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    ema = ModelEmaV2(model, decay=0.9) if version == "v2" else ModelEmaV3(model, decay=0.9, foreach=True)
    return model, optimizer, ema


def train(objs, steps: int = 3) -> list[torch.Tensor]:
    model, optimizer, model_ema = objs
    num_updates = 0
    val = []
    for _ in range(steps):
        model.train()
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
        output = model(x)
        loss = F.cross_entropy(output, y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        num_updates += 1  # noqa: SIM113 - as timm's train loop counts
        if isinstance(model_ema, EmaV2) or type(model_ema).__name__ == "ModelEmaV2":
            model_ema.update(model)
        else:
            model_ema.update(model, step=num_updates)
        with torch.no_grad():  # validate the EMA weights
            val.append(model_ema.module(x).clone())
    return val


def modules(objs) -> tuple:
    return objs[0], objs[2]


def main() -> None:
    torch.set_num_threads(1)
    for version in ("v2", "v3"):
        torch.manual_seed(0)
        train(build(version))
        print("ema", version, "ok")


if __name__ == "__main__":
    main()
