"""The same full backward hook, with ReLU(inplace=False) after the hooked layer."""
import torch
from torch import nn


def hook(module: nn.Module, grad_input: object, grad_output: object) -> None:
    return None


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=False), nn.Linear(8, 2))
    model[0].register_full_backward_hook(hook)
    model(torch.randn(3, 4, requires_grad=True)).sum().backward()


main()
