"""A model's plain attributes that hold tensors or generators: what `Preserved` gives back besides
parameters and buffers.

Modules keep state outside `_parameters` and `_buffers`: a cache (`self.k_cache = torch.cat(...)`),
the last activation for inspection (`self.attn = weights`, which holds the run's whole graph), a
running sum written in place, a scale its author forgot to make a Parameter (backward gives it a
`.grad`), a `torch.Generator` for reproducible noise. `PlainAttributes` records them when a run
starts and puts them back when it ends: an attribute rebound to or from a value holding tensors
is bound again (one forward added is removed), and the tensors and generators it found are
returned to be protected (values, `.grad`, `requires_grad`, generator state) with the model's own.
Attributes that hold no tensor (counters, flags, lists of strings) are the model's business and
stay as forward left them; so do tensors put into a list or dict that forward mutates in place.
"""

from __future__ import annotations

from typing import Any

import torch

#: what every Module keeps in its __dict__ (flags, parameter/buffer/submodule tables, hook dicts)
_INTERNAL = frozenset(vars(torch.nn.Module()))
_ABSENT = object()


def _holds_tensors(value: Any, depth: int = 4) -> bool:
    """A tensor, or lists, tuples and dicts nested up to `depth` deep holding one."""
    if isinstance(value, torch.Tensor):
        return True
    if depth and isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return any(_holds_tensors(v, depth - 1) for v in items)
    return False


class PlainAttributes:
    """The plain attributes of `modules`, recorded now and put back by `restore()`."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self._found: list[tuple[torch.nn.Module, dict[str, Any]]] = []
        self.tensors: list[torch.Tensor] = []  # held directly by an attribute: protected like parameters
        self.generators: list[torch.Generator] = []
        for module in modules:
            plain = {k: v for k, v in vars(module).items() if k not in _INTERNAL}
            self._found.append((module, plain))
            for value in plain.values():
                if isinstance(value, torch.Tensor):
                    self.tensors.append(value)
                elif isinstance(value, torch.Generator):
                    self.generators.append(value)

    def restore(self) -> None:
        """Rebind what forward rebound or added, where the old or the new value holds tensors."""
        for module, before in self._found:
            now = vars(module)
            for name in [k for k in now if k not in _INTERNAL and k not in before]:
                if _holds_tensors(now[name]):
                    del now[name]
            for name, value in before.items():
                current = now.get(name, _ABSENT)
                if current is not value and (_holds_tensors(value) or _holds_tensors(current)):
                    now[name] = value
        self._found = []
