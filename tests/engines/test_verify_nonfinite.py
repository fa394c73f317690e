"""verify() on tensors holding NaN/inf: compared by position, never blamed on NaN arithmetic."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.engines.verify import ATOL, RTOL
from inplace_doctor.engines.verify.compare import compare_stage

NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Residual(nn.Module):
    """`x + relu_(x)`: the in-place write changes the result wherever x < 0."""

    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return x + self.act(x)


def test_nan_in_the_input_is_equivalent_with_a_note_not_a_difference():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    x[0, 1] = NAN
    result = ipd.verify(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)), x)
    assert result and result.differences == [] and result.culprits == []
    text = str(result)
    assert text.startswith("equivalent:")
    assert "note: both runs have NaN in output[0] at the same places (4 elements)" in text
    assert "note: both runs have NaN in input args[0] after the call at the same places (1 element)" in text
    assert "max relative nan" not in text


def test_inf_in_the_input_at_the_same_places_is_equivalent():
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    x[1, 2] = INF
    result = ipd.verify(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2)), x)
    assert result, str(result)
    assert any("input args[0] after the call" in n and "inf" in n for n in result.notes)


def test_training_that_blows_up_to_inf_and_nan_is_equivalent_in_both_runs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))
    result = ipd.verify(model, torch.randn(6, 4) * 1e3, steps=3, optimizer=lambda p: torch.optim.SGD(p, lr=1e30))
    assert result, str(result)
    assert any(n.startswith("both runs have") and "parameter" in n for n in result.notes)


def test_a_real_difference_next_to_nan_is_measured_over_the_finite_elements():
    x = torch.tensor([[-4.0, NAN, 1.0, -2.0]])
    result = ipd.verify(Residual(), x)
    assert not result
    d = result.first_difference
    assert d.what == "output[0]" and d.nonfinite == ""
    assert d.max_abs == 4.0 and d.max_rel == 1.0  # configured 0 where the baseline has -4 (x=-4)
    assert str(result).startswith("not equivalent: output[0]: max abs difference 4, max relative 1\n")
    assert [c.where for c in result.culprits] == ["act"]
    assert "note: both runs have NaN in output[0] at the same places (1 element)" in str(result)


def test_inf_in_one_run_only_is_a_difference_that_says_so():
    x = torch.tensor([[-INF, -3.0, 2.0]])
    result = ipd.verify(Residual(), x)  # configured: relu_ turns -inf into 0, so x + x is 0; baseline: -inf
    d = result.first_difference
    assert d.what == "output[0]" and d.nonfinite == "inf in one run only at 1 element"
    assert math.isfinite(d.max_abs) and math.isfinite(d.max_rel)
    assert str(d) == (
        "output[0]: inf in one run only at 1 element; over the finite elements max abs difference 3, max relative 1"
    )


def test_compare_stage_counts_each_kind_of_non_finite_mismatch():
    a = torch.tensor([NAN, NAN, NAN, 1.0, INF, -INF, NAN, 2.0, 5.0], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0, 3.0, 1.0, -INF, -INF, NAN, 2.0, 5.0 + 1e-9], dtype=torch.float64)
    [d] = compare_stage([("loss", a)], [("loss", b)], ATOL, RTOL)
    assert d.nonfinite == "NaN in one run only at 3 elements, inf of opposite signs at 1 element"
    assert d.max_abs == pytest.approx(1e-9) and not math.isnan(d.max_rel)
    notes: list[str] = []
    same = torch.tensor([NAN, INF, 1.0])
    assert compare_stage([("grad of w", same)], [("grad of w", same.clone())], ATOL, RTOL, notes) == []
    assert notes == ["both runs have NaN and inf in grad of w at the same places (2 elements)"]
