# mypy: ignore-errors
"""y = x + relu_(x): usually silent (forward becomes 2 * relu(x)), an error only if x was saved."""

import torch
from torch import nn

import inplace_doctor as ipd

CLAIM = "y = x + relu_(x) raises an error at backward"
SOURCE = "seed 000"


class Residual(nn.Module):
    def __init__(self, saver: nn.Module) -> None:
        super().__init__()
        self.fc, self.saver, self.act = nn.Linear(8, 8), saver, nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.saver(self.fc(x))
        return h + self.act(h)


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    silent = Residual(nn.Identity())
    out = silent(x)
    h = silent.fc(x)
    doubled = torch.allclose(out, 2 * torch.relu(h))
    codes = ipd.audit(silent, x).codes
    try:
        Residual(nn.Tanh())(x).sum().backward()
        raised = False
    except RuntimeError:
        raised = True
    return (f"after Linear: no error, output == 2*relu(h): {doubled}, audit: {codes}; after Tanh: raises: {raised}",
            "PARTLY" if doubled and raised else "TRUE")
