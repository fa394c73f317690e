"""verify(): the in-place configuration against its out-of-place form, and who is responsible."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.cli.main import main
from inplace_doctor.examples import LinearThenReLU, ResidualReLU, SigmoidThenReLU
from inplace_doctor.testing import assert_equivalent, assert_inplace_safe


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_residual_module_flag_is_named_as_the_culprit():
    torch.manual_seed(0)
    result = ipd.verify(ResidualReLU(), torch.randn(4, 8))
    assert not result and result.equivalent is False
    assert result.first_difference.what == "output[0]" and result.first_difference.max_abs > 0
    assert [str(c) for c in result.culprits] == ["module act (inplace=True)"]


class FunctionalResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        return torch.cat([F.relu(h, inplace=True), h], 1)  # <functional>


def test_functional_inplace_argument_is_named_by_its_line():
    torch.manual_seed(0)
    result = ipd.verify(FunctionalResidual(), torch.randn(3, 6))
    [culprit] = result.culprits
    line = next(i + 1 for i, t in enumerate(Path(__file__).read_text().splitlines()) if t.endswith("# <functional>"))
    assert culprit.kind == "call" and culprit.where == f"{__file__}:{line}"


class ThreeFlags(nn.Module):
    """Two flags change the result (`b`, `c`); `a` is safe."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.a = nn.ReLU(inplace=True)
        self.b = nn.ReLU(inplace=True)
        self.c = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.a(self.fc(x))
        g = self.fc(x)
        k = self.fc(x) * 2
        return h + self.b(g) + g + self.c(k) + k  # each flag's write lands before the read after it


def test_several_culprits_are_found_and_the_safe_flag_is_not():
    torch.manual_seed(0)
    result = ipd.verify(ThreeFlags(), torch.randn(5, 4))
    assert {c.where for c in result.culprits} == {"b", "c"}
    assert result.runs < 2 + 2 * 4  # group testing, not one run per site and subset


def test_first_layer_overwriting_the_input_is_a_difference_in_the_input():
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(4, 2))
    result = ipd.verify(model, torch.randn(3, 4))
    assert result.first_difference.what == "input args[0] after the call"
    assert [c.where for c in result.culprits] == ["0"]


def test_configured_run_that_raises_carries_the_audit_finding():
    result = ipd.verify(SigmoidThenReLU(), torch.randn(4, 8))
    assert not result
    assert "modified by an inplace operation" in result.error
    assert [f.code for f in result.findings] == ["IPD101"]
    assert "IPD101" in str(result)


def test_steps_with_an_optimizer_compare_parameters_after_each_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True), nn.Dropout(0.3), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    result = ipd.verify(model, torch.randn(6, 4), steps=3, optimizer=opt)
    assert result, str(result)
    broken = ipd.verify(ResidualReLU(), torch.randn(4, 8), steps=2, optimizer=lambda p: torch.optim.Adam(p))
    assert any(d.what.startswith("parameter ") for d in broken.differences)


def test_verify_leaves_the_model_and_rng_exactly_as_found():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(inplace=True), nn.Dropout(0.5))
    model[0].weight.grad = torch.ones(4, 4)
    grad = model[0].weight.grad
    model[1].eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 4)
    rng, py, npy = torch.get_rng_state(), random.getstate(), np.random.get_state()
    ipd.verify(model, x, steps=2, optimizer=lambda p: torch.optim.SGD(p, lr=1.0))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert model[0].weight.grad is grad and torch.equal(grad, torch.ones(4, 4))
    assert model[1].training is False and model[0].training is True
    assert torch.equal(torch.get_rng_state(), rng) and random.getstate() == py
    assert np.array_equal(np.random.get_state()[1], npy[1])


TORCHVISION = [
    ("resnet18", 32), ("resnet50", 32), ("densenet121", 32), ("googlenet", 32), ("inception_v3", 75),
    ("mobilenet_v2", 32), ("mobilenet_v3_small", 32), ("mnasnet0_5", 32), ("shufflenet_v2_x0_5", 32),
    ("squeezenet1_0", 32), ("efficientnet_b0", 32), ("regnet_y_400mf", 32), ("alexnet", 63), ("vgg11", 32),
]
TIMM = ["resnet10t", "mobilenetv3_small_050", "ghostnet_050", "lcnet_050", "mixnet_s", "rexnet_100"]


@pytest.mark.parametrize("name, px", TORCHVISION, ids=[n for n, _ in TORCHVISION])
def test_torchvision_models_are_equivalent_with_dropout_active(name, px):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    extra = {"init_weights": True} if name in ("googlenet", "inception_v3") else {}
    if name == "inception_v3":
        extra["aux_logits"] = False  # 75 px is its floor without the aux head
    model = getattr(torchvision.models, name)(weights=None, num_classes=10, **extra).train()
    assert_equivalent(model, torch.randn(2, 3, px, px))


@pytest.mark.parametrize("name", TIMM)
def test_timm_models_are_equivalent(name):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10).train()
    result = assert_equivalent(model, torch.randn(2, 3, 32, 32))
    assert result.sites  # these models do use in-place flags


def test_testing_helpers_fail_with_the_report_and_the_culprit():
    with pytest.raises(AssertionError, match="IPD101"):
        assert_inplace_safe(SigmoidThenReLU(), torch.randn(4, 8))
    with pytest.raises(AssertionError, match="module act"):
        assert_equivalent(ResidualReLU(), torch.randn(4, 8))
    assert assert_inplace_safe(LinearThenReLU(), torch.randn(4, 8)).findings == []
    assert assert_equivalent(LinearThenReLU(), torch.randn(4, 8))


def test_cli_verify_exit_codes(capsys):
    assert main(["verify", "inplace_doctor.examples:residual_relu"]) == 1
    assert "responsible: module act" in capsys.readouterr().out
    assert main(["verify", "inplace_doctor.examples:linear_then_relu", "--steps", "2", "--sgd", "0.1"]) == 0
    assert main(["verify", "inplace_doctor.examples"]) == 2


_PEAK_RSS_SCRIPT = """
import resource, torch
from torch import nn
import inplace_doctor as ipd

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, 1))  # 64 MiB of weights
x = torch.randn(4, 4096)
opt = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)
ipd.verify(nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True)), torch.randn(2, 8), optimizer=opt)  # lazy imports
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = ipd.verify(model, x, optimizer=opt, steps=3)
assert result.equivalent, str(result)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_verify_holds_two_copies_of_the_model_not_recordings_of_its_runs() -> None:
    # Each run holds its copy, its gradients and its momentum: 3 x 64 MiB. Compared stage by
    # stage, the two runs need about 6 x 64 MiB at once; recording both runs' gradients and
    # parameters after each of 3 steps (as verify once did) needed about 15 x 64 MiB.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PEAK_RSS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    grown = int(done.stdout.strip().splitlines()[-1])
    weights = 4096 * 4096 * 4
    assert grown < 8 * weights, f"verify's peak grew by {grown / weights:.1f} x the model's weights"
