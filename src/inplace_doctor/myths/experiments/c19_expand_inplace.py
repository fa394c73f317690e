# mypy: ignore-errors
"""In-place on an expand()ed tensor: arithmetic raises (internal overlap), fill_/zero_ are allowed."""

import torch

CLAIM = "in-place ops on expand() views raise"
SOURCE = "seed 004"


def run() -> tuple[str, str]:
    out = {}
    for name, op in (("add_", lambda t: t.add_(1)), ("fill_", lambda t: t.fill_(1)), ("zero_", lambda t: t.zero_())):
        e = torch.zeros(1, 3).expand(4, 3)
        try:
            op(e)
            out[name] = "allowed"
        except RuntimeError:
            out[name] = "raises"
    partly = out["add_"] == "raises" and out["fill_"] == "allowed"
    return (", ".join(f"{k}: {v}" for k, v in out.items()), "PARTLY" if partly else "TRUE")
