"""Which bytes of which storage a tensor covers."""

from __future__ import annotations

import torch


def storage_span(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage key, first byte, end byte) of the memory a tensor covers, or None."""
    try:
        if t.is_inference():
            return None
        storage = t.untyped_storage()
        numel = t.numel()
        if numel == 0 or storage.nbytes() == 0:
            return None
        size = t.element_size()
        start = int(t.storage_offset())
        if t.is_contiguous():
            extent = numel - 1
        else:
            extent = sum((int(n) - 1) * abs(int(s)) for n, s in zip(t.shape, t.stride()))
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, meta, no storage
        return None
    return storage.data_ptr(), start * size, (start + extent + 1) * size


def storage_key(t: torch.Tensor) -> int:
    """`storage_span(t)[0]` alone, for a tensor autograd saved (never an inference tensor): 0 without storage."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, meta, no storage
        return 0
