"""A fingerprint of a tensor's bytes: equal exactly when the bytes are (to a high probability), at
a bounded cost, without an op the tracer sees and without bumping a version.

The bytes are read as 64-bit integers (narrower words at a misaligned edge), laid out as rows of
`_ROW` words, and reduced with wrapping integer arithmetic: the row sums weighted by odd
position weights, and the column sums weighted likewise. An odd weight is invertible modulo
2**64, so any single changed word changes the fingerprint, and so does moving values between
rows or between columns (a swap). Bytes, not values: NaN compares by its bits, -0.0 differs from
0.0. `torch.hash_tensor` (2.14) is an order-blind XOR and six times slower on CPU.

Cost (measured by `benchmarks/contents.py`): about 70 us per MiB on one CPU core, each time.
"""

from __future__ import annotations

import torch

from .. import _compat

Fingerprint = tuple[int, ...]

_ROW = 512  # words per row: 4 KiB
_WIDTHS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def fingerprint(t: torch.Tensor) -> Fingerprint | None:
    """The fingerprint of `t`'s elements' bytes, or None for a tensor without plain strided memory."""
    try:
        if t.layout is not torch.strided or t.device.type == "meta" or t.is_quantized:
            return None
        with _compat.DisableTorchDispatch(), torch._C.DisableTorchFunction(), torch.no_grad():
            if t.numel() == 0:
                return (0,)
            flat = t.detach()
            if not flat.is_contiguous():
                flat = flat.contiguous()  # a copy, for the rare non-contiguous saved tensor
            raw = flat.reshape(-1).view(torch.uint8)
            return _reduce(raw)
    except (RuntimeError, NotImplementedError, TypeError):  # no storage, a dtype without a byte view
        return None


def _reduce(raw: torch.Tensor) -> Fingerprint:
    n = raw.numel()
    parts: list[int] = [n]
    start = 0
    for width, dtype in _WIDTHS:
        count = (n - start) // width
        if count == 0:
            continue
        chunk = raw[start : start + count * width]
        try:
            words = chunk.view(dtype)  # refuses a misaligned start: try a narrower word
        except RuntimeError:
            continue
        if dtype is not torch.int64:
            words = words.to(torch.int64)  # only edges and odd-sized tensors are narrow
        parts.extend(_weighted(words))
        start += count * width
        if start == n:
            break
    return tuple(parts)


def _weighted(words: torch.Tensor) -> tuple[int, int, int]:
    full = words.numel() // _ROW
    tail = words[full * _ROW :]
    tail_sum = int((tail * _odd(tail.numel(), tail.device)).sum()) if tail.numel() else 0
    if not full:
        return 0, 0, tail_sum
    grid = words[: full * _ROW].view(full, _ROW)
    rows = int((grid.sum(1) * _odd(full, grid.device)).sum())
    columns = int((grid.sum(0) * _odd(_ROW, grid.device)).sum())
    return rows, columns, tail_sum


_odd_cache: dict[tuple[int, torch.device], torch.Tensor] = {}


def _odd(n: int, device: torch.device) -> torch.Tensor:
    """1, 3, 5, ... (2n-1): odd, so invertible modulo 2**64."""
    weights = _odd_cache.get((n, device))
    if weights is None:
        weights = torch.arange(1, 2 * n, 2, dtype=torch.int64, device=device)
        if n <= _ROW:
            _odd_cache[(n, device)] = weights
    return weights
