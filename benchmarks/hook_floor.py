"""What do PyTorch's Python hooks cost with empty bodies? The floor under the fast tracer.

    . .venv/bin/activate && python benchmarks/hook_floor.py          # ~1 min

The fast tracer (issue 26) enters Python at four kinds of hook. This script
times the MLP of `overhead.py` (30 x Linear(64, 64) + GELU, batch 16, one
forward + backward) under each kind alone with a body that does nothing, and
under all four at once, to show what no body of the tool's can go below:

- packs:    `saved_tensors_hooks` whose pack makes a one-slot record of a detached alias
            (not the tensor itself: returning it keeps it alive, PYTORCH_FACTS.md);
- packs_tb: the same with `torch._C._profiler.gather_traceback` in the pack (a stack in C);
- nodes:    autograd's node-creation hook;
- mods:     global forward pre- and post-hooks on every module call;
- tfm:      a pass-through `TorchFunctionMode`;
- all4:     packs, nodes, mods and tfm together.

Method as in `overhead.py`: one intra-op thread, CPU time, warm-up first,
interleaved rounds, the minimum per variant and its ratio to plain. This
script prints measurements; it asserts nothing.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from inplace_doctor import _compat


class _Record:
    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def packs() -> Iterator[None]:
    with torch.autograd.graph.saved_tensors_hooks(lambda t: _Record(t.detach()), lambda r: r.tensor):
        yield


@contextlib.contextmanager
def packs_tb() -> Iterator[None]:
    gather = torch._C._profiler.gather_traceback

    def pack(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return t.detach(), gather(True, True, False)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda r: r[0]):
        yield


@contextlib.contextmanager
def nodes() -> Iterator[None]:
    _compat.push_node_creation_hook(lambda node: None)
    try:
        yield
    finally:
        _compat.pop_node_creation_hook()


@contextlib.contextmanager
def mods() -> Iterator[None]:
    module = torch.nn.modules.module
    pre = module.register_module_forward_pre_hook(lambda m, args: None)
    post = module.register_module_forward_hook(lambda m, args, out: None)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


@contextlib.contextmanager
def tfm() -> Iterator[None]:
    with _PassThrough():
        yield


@contextlib.contextmanager
def all4() -> Iterator[None]:
    with packs(), nodes(), mods(), tfm():
        yield


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "plain": nothing, "packs": packs, "packs_tb": packs_tb, "nodes": nodes, "mods": mods, "tfm": tfm, "all4": all4,
}


def main(rounds: int = 300) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(30):
        layers += [nn.Linear(64, 64), nn.GELU()]
    model, x = nn.Sequential(*layers), torch.randn(16, 64)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    for _ in range(20):
        step()
    gc.collect()
    gc.freeze()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            with VARIANTS[name]():
                start = time.process_time()
                step()
                times[name].append(time.process_time() - start)
    plain = min(times["plain"])
    print(f"torch {torch.__version__}, MLP 30 x Linear(64, 64) + GELU, batch 16, {rounds} rounds, CPU time")
    for name in names:
        best = min(times[name])
        print(f"{name:9s} {best * 1e3:7.3f} ms  x{best / plain:.2f}")


if __name__ == "__main__":
    main()
