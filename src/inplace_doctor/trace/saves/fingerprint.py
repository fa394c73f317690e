"""A fingerprint of a tensor's bytes: equal exactly when the bytes are (to a high probability), at
a bounded cost, without an op the tracer sees and without bumping a version.

The bytes are read as 64-bit integers (narrower words at a misaligned edge), laid out as rows of
`_ROW` words, and reduced with wrapping integer arithmetic: the row sums (odd weights 1, 3, 5 ...)
and the column sums (even weights 2, 4, 6 ...) side by side, summed. Each word's total weight is
odd, hence invertible modulo 2**64, so any single changed word changes the fingerprint; moving
values between rows or between columns (a swap) does too, unless the two words differ in their
top bit only. Not a cryptographic hash: changes crafted to cancel can collide. Bytes, not values: NaN compares by its bits, -0.0 differs from
0.0. `torch.hash_tensor` (2.14) is an order-blind XOR and six times slower on CPU.

Cost (measured by `benchmarks/contents.py`): about 70 us per MiB on one CPU core, each time.
"""

from __future__ import annotations

import torch

from ... import _compat

Fingerprint = tuple[int, ...]

_ROW = 512  # words per row: 4 KiB
_WIDTHS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


def fingerprint(t: torch.Tensor) -> Fingerprint | None:
    """The fingerprint of `t`'s elements' bytes, or None for a tensor without plain strided memory."""
    try:
        if t.layout is not torch.strided or t.is_quantized or t.device.type == "meta":
            return None
        with _compat.DisableTorchDispatch(), torch._C.DisableTorchFunction(), torch.no_grad():
            n = t.numel() * t.element_size()
            if n == 0:
                return (0,)
            if not t.is_contiguous():
                t = t.contiguous()  # a copy, for the rare non-contiguous saved tensor
            raw = t.reshape(-1).view(torch.uint8)
            if n % 8 == 0 and n >= 8 * _ROW:
                try:  # the common case in one reduction: whole rows of int64 words
                    return (n, *_weighted(raw.view(torch.int64)))
                except RuntimeError:  # a misaligned start: the general path
                    pass
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


def _weighted(words: torch.Tensor) -> tuple[int, ...]:
    """Weighted sums of the row sums, the column sums and the words of a last, partial row, in one
    reduction and one read back. Each word counts once in its row's sum (odd weight) and once in its
    column's (even weight), so its total weight is odd: any single changed word shows."""
    full = words.numel() // _ROW
    tail = words.numel() - full * _ROW
    sums = []
    if full:
        grid = words[: full * _ROW].view(full, _ROW)
        sums += [grid.sum(1), grid.sum(0)]
    if tail:
        sums.append(words[full * _ROW :])
    joined = torch.cat(sums) if len(sums) > 1 else sums[0]
    return (int((joined * _weights(full, tail, joined.device)).sum()), full)


_weights_cache: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _weights(rows: int, tail: int, device: torch.device) -> torch.Tensor:
    """Odd weights 1, 3, 5 ... for the row sums, even 2, 4, 6 ... for the column sums, odd for the tail."""
    key = (rows, tail, device)
    weights = _weights_cache.get(key)
    if weights is None:
        parts = [torch.arange(1, 2 * tail, 2, dtype=torch.int64, device=device)] if tail else []
        if rows:
            parts = [
                torch.arange(1, 2 * rows, 2, dtype=torch.int64, device=device),
                torch.arange(2, 2 * _ROW + 1, 2, dtype=torch.int64, device=device),
                *parts,
            ]
        weights = torch.cat(parts)
        if len(_weights_cache) < 256:
            _weights_cache[key] = weights
    return weights
