# mypy: ignore-errors
"""inplace=True does not lower the training peak of conv-BN-ReLU nets (measured with ipd.memory)."""

import torch
import torchvision

import inplace_doctor as ipd

CLAIM = "ReLU(inplace=True) saves 30-50 % of training memory"
SOURCE = "seed 000"


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    x = torch.randn(2, 3, 64, 64)

    def sgd(p):
        return torch.optim.SGD(p, lr=0.01, momentum=0.9)

    shipped = ipd.memory(model, x, optimizer=sgd).peak
    for m in model.modules():
        if isinstance(m, torch.nn.ReLU):
            m.inplace = False
    off = ipd.memory(model, x, optimizer=sgd).peak
    saved = off - shipped
    return (f"resnet18, 2x3x64x64, SGD-momentum step: peak {shipped:,} B in place, {off:,} B out of place "
            f"({saved:,} B saved)", "FALSE" if saved * 10 < off else "TRUE")
