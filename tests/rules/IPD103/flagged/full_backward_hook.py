"""Grad-CAM's full backward hook on a layer whose output an in-place ReLU then overwrites."""
import torch
from torch import nn


def hook(module: nn.Module, grad_input: object, grad_output: object) -> None:
    return None


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    model[0].register_full_backward_hook(hook)
    model(torch.randn(3, 4)).sum()  # expect: IPD103


main()
