"""The dispatch mode's own small judgements."""

from __future__ import annotations

import torch

from inplace_doctor.trace.deep.dispatch_mode import copies_onto_itself


def test_a_copy_onto_its_own_memory_is_told_from_a_real_copy() -> None:
    w = torch.randn(4, 3)
    assert copies_onto_itself((w, w))
    assert copies_onto_itself((w, w.detach()))  # a state_dict() entry: same memory, another tensor
    assert not copies_onto_itself((w, w.clone()))
    assert not copies_onto_itself((w[1:], w[:-1]))  # overlapping, shifted: values move
    square = torch.randn(3, 3)
    assert not copies_onto_itself((square, square.t()))  # same bytes, other element order
    assert not copies_onto_itself((w, 1.0))
