"""optimize's text groups alike sites under the globs of its inplace.toml; its measurements cost what
the model's steps cost, with the plan's decisions as they were."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

import inplace_doctor as ipd

GOLDEN = Path(__file__).parent / "golden" / "optimize_decisions.json"


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


class NoGradBlock(nn.Module):
    """A block whose out-of-place activation follows a `no_grad` Linear: switching all of them on
    lowers the peak, so optimize measures each on its own (one memory measurement per site)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.Hardtanh(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.fc(x)
        return self.act(h) + x


def no_grad_blocks(n: int) -> nn.Sequential:
    return nn.Sequential(*[NoGradBlock() for _ in range(n)], nn.Linear(64, 1))


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """Full (generation 2) garbage collections while the test runs, with automatic collection off,
    so that each one seen was asked for."""
    seen: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    was_enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)
        if was_enabled:
            gc.enable()


def rows(plan: ipd.Plan) -> list[list[Any]]:
    return [[d.site, d.shipped, d.inplace, d.safe, d.saves_bytes, d.reason] for d in plan.decisions]


@pytest.fixture(scope="module")
def mobilenet_plan() -> ipd.Plan:
    torch.manual_seed(0)
    model = torchvision.models.get_model("mobilenet_v3_small", weights=None)
    return ipd.optimize(model, torch.randn(2, 3, 32, 32), optimizer=sgd, suggest_checkpoint=False, steps=1)


def test_the_decisions_on_a_torchvision_model_are_as_before(mobilenet_plan: ipd.Plan) -> None:
    golden = json.loads(GOLDEN.read_text())["mobilenet_v3_small"]
    assert [mobilenet_plan.peak_shipped, mobilenet_plan.peak_planned] == golden["peaks"]
    assert rows(mobilenet_plan) == golden["decisions"]


def test_measuring_each_site_costs_no_collection_of_the_whole_heap(full_collections: list[int]) -> None:
    # One memory measurement per safe site (6 here): a full collection before each walks every object
    # of the interpreter (torch, the frameworks imported), more than a small model's step costs.
    torch.manual_seed(0)
    plan = ipd.optimize(no_grad_blocks(6), torch.randn(256, 64), optimizer=sgd, suggest_checkpoint=False, steps=1)
    golden = json.loads(GOLDEN.read_text())["no_grad_blocks"]
    assert [plan.peak_shipped, plan.peak_planned] == golden["peaks"]
    assert rows(plan) == golden["decisions"]
    assert full_collections == []


def test_the_text_groups_alike_sites_under_the_glob_the_config_writes(mobilenet_plan: ipd.Plan) -> None:
    text = str(mobilenet_plan)
    toml = mobilenet_plan.toml()
    glob = "features.*.block.*.activation"
    assert f'"{glob}" = false  # 9 modules: safe, saves 0 bytes' in toml
    line = next(line for line in text.splitlines() if glob in line)
    assert line.split() [:4] == [glob, "off", "->", "off"] and "9 modules: safe, saves 0 bytes" in line
    assert "features.1.block.1.activation" not in text and "features.4.block.2.activation" not in text
    # Sites the config writes one by one stay one line each.
    assert "features.0.2 " in text and '"features.0.2" = true' in toml


def test_forty_two_alike_sites_read_as_one_line() -> None:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(42):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    plan = ipd.optimize(nn.Sequential(*layers), torch.randn(4, 8), optimizer=sgd, suggest_checkpoint=False, steps=1)
    assert len(plan.decisions) == 42
    flags = [line for line in str(plan).splitlines() if line.startswith(" ") and " -> " in line]
    assert flags == ["   *  off -> off  42 modules: safe, saves 0 bytes at the peak: left off (enabling it adds risk for no gain)"]
    assert '"*" = false  # 42 modules' in plan.toml()
