"""The fast tracer's reads, only while one is awaited (issue 26): IPD107's stale `state_dict()` aliases.

The fast tracer sees no op but writes. A rule that waits for a *read* (a
stale alias used as a snapshot) needs every op only while such a suspect is
pending: `PendingReads` pushes a pass-through dispatch mode on this thread's
stack when a write leaves a held alias stale, and pops it at the first write
kernel after none is pending any more (the stale alias was used, or freed).
Between those points every op enters Python, as in deep mode; elsewhere none
does.

Known limitations: the mode is pushed and popped only while it is the top of
the thread's dispatch-mode stack (a mode the program entered after it stays
above it until the program leaves that mode); a stale alias kept for the
rest of the run keeps the mode on for the rest of the run.
"""

from __future__ import annotations

from typing import Any

from .. import _compat
from .aliases import HeldTensors
from .ops import _op_facts, op_facts, written_tensors
from .owner import Busy


class _ReadMode(_compat.TorchDispatchMode):
    """Pass-through: each op's tensor arguments checked against the stale aliases, nothing else."""

    def __init__(self, busy: Busy, held: HeldTensors) -> None:
        super().__init__()
        self.busy = busy
        self.held = held
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if not self.busy.on and self.held.stale_ids:
            self.ops += 1
            _, spec, _ = _op_facts.get(id(func)) or op_facts(func)
            written = written_tensors(spec, args, kwargs) if spec else None
            self.held.check_uses(func, args, kwargs, written)
        return func(*args, **kwargs)


class PendingReads:
    """Turns `_ReadMode` on while a stale held alias awaits its use, off once none does."""

    def __init__(self, busy: Busy, held: HeldTensors) -> None:
        self.held = held
        self.mode = _ReadMode(busy, held)
        self.on = False
        #: times the mode was turned on (the report's statistics may show it)
        self.turned_on = 0

    def pending(self) -> bool:
        """Whether a live stale alias awaits its use (freed ones are dropped here)."""
        stale = self.held.stale_ids
        if stale and any(e.ref() is None for e in stale.values()):
            for key in [k for k, e in stale.items() if e.ref() is None]:
                del stale[key]
        return bool(stale)

    def __enter__(self) -> "PendingReads":
        return self

    def __exit__(self, *exc: object) -> None:
        self.off()

    def update(self) -> None:
        """Called by the write kernels' hooks: the mode on when a read is awaited, off when none is."""
        wanted = self.pending()
        if wanted == self.on:
            return
        if wanted:
            _compat.push_dispatch_mode(self.mode)
            self.on = True
            self.turned_on += 1
        else:
            self.off()

    def off(self) -> None:
        """Pop the mode, if it is the top of this thread's stack (else it stays until it is)."""
        if self.on and _top_mode() is self.mode:
            _compat.pop_dispatch_mode(None)
            self.on = False


def _top_mode() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


__all__ = ["PendingReads"]
