# mypy: ignore-errors
"""In-place ops with autocast + GradScaler do not produce NaNs (CPU autocast, bf16)."""

import torch
from torch import nn

CLAIM = "inplace ops with AMP's GradScaler produce NaN gradients (17.3 % of runs)"
SOURCE = "seed 000"


def _train(inplace: bool, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=inplace), nn.Linear(32, 32), nn.ReLU(inplace=inplace), nn.Linear(32, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for _ in range(10):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(torch.randn(8, 16)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return [p.detach().clone() for p in net.parameters()]


def run() -> tuple[str, str]:
    same = nan = 0
    for seed in range(8):
        a, b = _train(True, seed), _train(False, seed)
        same += all(torch.equal(p, q) for p, q in zip(a, b))
        nan += any(torch.isnan(p).any().item() for p in a)
    return (f"8 seeded runs: {same}/8 bitwise equal to out-of-place, {nan} with NaN", "FALSE" if same == 8 and nan == 0 else "TRUE")
