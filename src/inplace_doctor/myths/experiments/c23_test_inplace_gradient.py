# mypy: ignore-errors
"""The seed's `test_inplace_gradient` script, run on eight small models next to `ipd.verify`."""

import copy

import torch
from torch import nn

import inplace_doctor as ipd

CLAIM = "test_inplace_gradient (deepcopy, set every nn.ReLU to inplace=False, compare grads) validates an in-place setting"
SOURCE = "seed 000"


def test_inplace_gradient(model: nn.Module, x: torch.Tensor) -> bool:
    # Verbatim from the seed (section 3.1), with its line breaks restored.
    model_no_inplace = copy.deepcopy(model)
    for m in model_no_inplace.modules():
        if isinstance(m, nn.ReLU):
            m.inplace = False
    y1 = model_no_inplace(x).sum()
    y1.backward()
    grad_no_inplace = [p.grad.clone() for p in model_no_inplace.parameters()]
    y2 = model(x).sum()
    y2.backward()
    grad_inplace = [p.grad.clone() for p in model.parameters()]
    for i, (g1, g2) in enumerate(zip(grad_no_inplace, grad_inplace)):
        if not torch.allclose(g1, g2, atol=1e-6):
            return False
    return True


class Residual(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(8, 8), act, nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.out(h + self.act(h))  # the residual reads h after act overwrote it


class WithUnusedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8))
        self.aux = nn.Linear(8, 2)  # used only in another mode: its .grad stays None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _outcome(fn) -> str:
    try:
        return str(fn())
    except Exception as e:  # what the script does to its user
        return type(e).__name__


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    safe = lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8))  # noqa: E731
    cases = {
        # name: (model factory, input factory, the right answer)
        "residual after ReLU(inplace=True)": (lambda: Residual(nn.ReLU(inplace=True)), lambda: torch.randn(4, 8), False),
        "residual after LeakyReLU(inplace=True)": (lambda: Residual(nn.LeakyReLU(0.1, inplace=True)), lambda: torch.randn(4, 8), False),
        "Dropout, nothing in place": (lambda: nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8)), lambda: torch.randn(4, 8), True),
        "a parameter without a gradient": (WithUnusedHead, lambda: torch.randn(4, 8), True),
        "input that requires grad": (lambda: nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 8)), lambda: torch.randn(4, 8, requires_grad=True), False),
        "in-place breaks backward": (lambda: nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.ReLU(inplace=True)), lambda: torch.randn(4, 8), False),
    }
    wrong, verify_wrong = [], []
    for name, (make, make_x, right) in cases.items():
        torch.manual_seed(1)
        model, x = make(), make_x()
        got = _outcome(lambda: test_inplace_gradient(model, x))
        if got != str(right):
            wrong.append(f"{name}: {got}")
        torch.manual_seed(1)
        model, x = make(), make_x()
        if bool(ipd.verify(model, x)) != right:
            verify_wrong.append(name)

    # Called twice on a safe model: the copy's .grad starts empty, the model's accumulates.
    torch.manual_seed(1)
    model, x = safe(), torch.randn(4, 8)
    twice = [_outcome(lambda: test_inplace_gradient(model, x)) for _ in range(2)]
    if twice != ["True", "True"]:
        wrong.append(f"called twice on a safe model: {', '.join(twice)}")
    verify_twice = [bool(ipd.verify(model, x)) for _ in range(2)]
    if verify_twice != [True, True]:
        verify_wrong.append("called twice on a safe model")

    # The caller's batch: ReLU(inplace=True) as the first layer overwrites it in the second run.
    torch.manual_seed(1)
    model, x = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 8)), torch.randn(4, 8)
    before = x.clone()
    test_inplace_gradient(model, x)
    if not torch.equal(x, before):
        wrong.append("first layer ReLU(inplace=True): caller's batch overwritten")
    x = before.clone()
    ipd.verify(model, x)
    if not torch.equal(x, before):
        verify_wrong.append("caller's input overwritten")

    total = len(cases) + 2
    measured = (
        f"the script is wrong on {len(wrong)} of {total} cases ({'; '.join(wrong)}); "
        f"ipd.verify on {len(verify_wrong)}" + (f" ({'; '.join(verify_wrong)})" if verify_wrong else "")
    )
    caught_residual = not any(w.startswith("residual after ReLU") for w in wrong)
    return measured, "PARTLY" if caught_residual and wrong else ("TRUE" if not wrong else "FALSE")
