# mypy: ignore-errors
"""The seed's INPLACE_CONFIG template, run as written, next to a config written by `ipd.optimize`."""

import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.engines.optimize.toml_config import apply_config

CLAIM = "the INPLACE_CONFIG template makes in-place decisions configurable and auditable (ReLU/LeakyReLU/GELU/SiLU per stage)"
SOURCE = "seed 000"

# Verbatim from the seed (section 3.2), with its quotes and line breaks restored.
INPLACE_CONFIG = {
    "backbone": {"ReLU": True, "LeakyReLU": True},
    "neck": {"ReLU": False, "GELU": True},
    "head": {"ReLU": True, "SiLU": True},
}


def build_activation(name, inplace=True):
    if name == "ReLU":
        return nn.ReLU(inplace=inplace)
    elif name == "LeakyReLU":
        return nn.LeakyReLU(0.1, inplace=inplace)
    elif name == "GELU":
        return nn.GELU()
    else:
        raise ValueError(f"Unknown activation: {name}")


def build_backbone(backbone_layers):
    acts = []
    for i, layer in enumerate(backbone_layers):
        if i in INPLACE_CONFIG["backbone"]["layers"]:
            act = build_activation("ReLU", inplace=INPLACE_CONFIG["backbone"]["ReLU"])
        else:
            act = build_activation("ReLU", inplace=False)
        acts.append(act)
    return acts


def _error(fn) -> str:
    try:
        fn()
        return "no error"
    except Exception as e:
        return f"{type(e).__name__}: {e}"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def run() -> tuple[str, str]:
    layers = _error(lambda: build_backbone([nn.Linear(8, 8)] * 3))
    silu = _error(lambda: build_activation("SiLU", inplace=INPLACE_CONFIG["head"]["SiLU"]))
    gelu = build_activation("GELU", inplace=INPLACE_CONFIG["neck"]["GELU"])
    gelu_flag = getattr(gelu, "inplace", "no such option")

    # The alternative: flags decided per call site from one measured run, applied by path.
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    plan = ipd.optimize(model, x, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    typo = _error(lambda: apply_config(Net(), {"backbone.3x": True}))
    measured = (
        f"building the backbone: {layers}; SiLU: {silu}; GELU(inplace=True) built: inplace = {gelu_flag}. "
        f"ipd.optimize decided {plan.config()}, verified equivalent: {bool(plan.verified)}; "
        f"a pattern matching nothing: {typo.splitlines()[0]}"
    )
    broken = layers.startswith("KeyError") and silu.startswith("ValueError")
    return measured, "FALSE" if broken else "PARTLY"
