"""IPD105 on inputs holding NaN/inf: the measured difference ignores unchanged NaN/inf and says when they matter."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import inplace_doctor as ipd

NAN, INF = float("nan"), float("inf")


def ipd105(x, model):
    return [f for f in ipd.audit(model, x).findings if f.code == "IPD105"]


class ResidualModule(nn.Module):
    def __init__(self, act=None):
        super().__init__()
        self.act = act or nn.ReLU(inplace=True)

    def forward(self, x):
        return x + self.act(x)


class AugmentedKeepsAlias(nn.Module):
    def __init__(self, other):
        super().__init__()
        self.other = other

    def forward(self, x):
        h = x * 1
        kept = h
        h += self.other
        return h * kept


def test_one_nan_in_the_input_reports_the_same_difference_as_the_finite_input():
    finite = torch.tensor([[-4.0, 1.0, -2.0, 3.0]])
    [f] = ipd105(finite.clone(), ResidualModule())
    assert f.facts.max_difference == 4.0
    with_nan = finite.clone()
    with_nan[0, 1] = NAN
    [g] = ipd105(with_nan, ResidualModule())
    assert g.facts.max_difference == 4.0
    assert "up to 4 away" in g.message and "difference 0" not in g.message


def test_hardtanh_and_leaky_relu_ignore_nan_and_the_same_inf():
    x = torch.tensor([[-4.0, NAN, 1.5, INF]])
    [f] = ipd105(x.clone(), ResidualModule(nn.ReLU6(inplace=True)))  # inf -> 6: inf on one side only
    assert f.facts.max_difference == INF
    x = torch.tensor([[-4.0, NAN, 0.5, -INF]])
    [g] = ipd105(x.clone(), ResidualModule(nn.LeakyReLU(0.5, inplace=True)))  # -inf stays -inf
    assert g.facts.max_difference == 2.0
    x = torch.tensor([[-4.0, NAN, 0.5, 1.5]])
    [h] = ipd105(x.clone(), ResidualModule(nn.Hardtanh(inplace=True)))
    assert h.facts.max_difference == 3.0


def test_a_value_turned_non_finite_is_said_to_be_so():
    other = torch.tensor([0.5, NAN, 1.0])
    [f] = ipd105(torch.tensor([1.0, 2.0, 3.0]), AugmentedKeepsAlias(other))  # 2 + NaN: NaN in the read only
    assert f.facts.max_difference == INF
    assert "NaN or infinite where the original was not" in f.message
    assert "difference 0" not in f.message


def test_nan_already_in_both_places_adds_only_the_finite_change():
    other = torch.tensor([0.5, NAN, 1.0])
    [f] = ipd105(torch.tensor([1.0, NAN, 3.0]), AugmentedKeepsAlias(other))  # NaN + NaN: unchanged
    assert f.facts.max_difference == 1.0
    assert "up to 1 away" in f.message


def test_functional_relu_on_nan_input():
    class Functional(nn.Module):
        def forward(self, x):
            out = F.relu(x, inplace=True)
            return torch.cat([out, x], dim=1)

    x = torch.tensor([[-2.5, NAN, 1.0]])
    [f] = ipd105(x, Functional())
    assert f.facts.max_difference == 2.5


def test_a_difference_that_meets_nan_is_not_called_zero():
    class Doubled(nn.Module):
        def forward(self, x):
            h = x * 1
            kept = h
            h *= 2  # measured from a snapshot: NaN - NaN, compared by position
            return h * kept

    [f] = ipd105(torch.tensor([1.0, NAN, 3.0]), Doubled())
    assert "difference 0" not in f.message and f.facts.max_difference == 3.0


class ScaledInPlace(nn.Module):
    """`y *= 2` is measured from a snapshot taken before the write (no closed form)."""

    def forward(self, x):
        h = x * 1
        kept = h
        h *= 2
        return h + kept


def test_the_snapshot_measurement_counts_nan_by_position():
    finite = torch.tensor([[-4.0, 1.0, -2.0, 3.0]])
    with_nan = finite.clone()
    with_nan[0, 1] = NAN  # unchanged by *= 2: the change elsewhere is what counts
    [a] = ipd105(finite, ScaledInPlace())
    [b] = ipd105(with_nan, ScaledInPlace())
    assert a.facts.max_difference == 4.0
    assert b.facts.max_difference == 4.0
    assert "up to 4 away" in b.why


def test_the_snapshot_measurement_says_when_inf_appears():
    x = torch.tensor([[1.0, 3e38]])  # 3e38 * 2 overflows float32 to inf
    [f] = ipd105(x, ScaledInPlace())
    assert f.facts.max_difference == INF
    assert "NaN or infinite where the original was not" in f.why
