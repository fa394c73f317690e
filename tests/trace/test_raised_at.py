"""The in-place call autograd refused before any kernel ran, read from the raising frame (`raised_at.py`)."""

from __future__ import annotations

import pytest
import torch

from inplace_doctor.trace.raised.raised_at import augmented_op_raised_at, receiver_raised_at


def test_an_augmented_assignment_on_a_leaf_is_named_by_its_operator() -> None:
    p = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable") as info:
        p -= 0.1 * torch.ones(3)
    assert augmented_op_raised_at(info.value.__traceback__) == "aten.sub_"
    with pytest.raises(RuntimeError, match="leaf Variable") as info:
        p *= 2
    assert augmented_op_raised_at(info.value.__traceback__) == "aten.mul_"


def test_a_method_call_is_not_an_augmented_assignment() -> None:
    p = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable") as info:
        p.add_(1)
    assert augmented_op_raised_at(info.value.__traceback__) is None


def test_the_receiver_of_a_refused_method_call_is_the_tensor_its_name_holds() -> None:
    x = torch.randn(2, 4, requires_grad=True)
    first, second = (x * 2).unbind(0)
    with pytest.raises(RuntimeError, match="multiple views") as info:
        first.mul_(2)
    assert receiver_raised_at(info.value.__traceback__) is first


def test_a_receiver_behind_a_nested_call_is_not_guessed() -> None:
    x = torch.randn(2, 4, requires_grad=True)
    first, second = (x * 2).unbind(0)
    with pytest.raises(RuntimeError, match="multiple views") as info:
        first.mul_(second.detach().sum())
    assert receiver_raised_at(info.value.__traceback__) is None
