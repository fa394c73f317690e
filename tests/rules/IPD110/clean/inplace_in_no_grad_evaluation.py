"""Evaluation under `torch.no_grad()` with in-place ops inside the model (ReLU(inplace=True), `x += y`),
between training steps: nothing made there requires grad, and its outputs are never backpropagated."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h += x
        return self.act(h)


torch.manual_seed(0)
model = nn.Sequential(Block(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        val = model(torch.randn(4, 8))
        val.clamp_(min=0)
    model.train()
