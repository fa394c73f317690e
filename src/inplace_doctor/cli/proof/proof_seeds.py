"""The same random numbers in every proof run, and what else a program reads that seeds do not fix.

`fix` and `run --prove` compare runs of the user's program (`prove.py`), and most scripts do not
seed. Each proof child (`recorder.py`) calls `seed()` before the program runs: Python's `random`,
NumPy's global generator (only where torch's import found NumPy: a program without it never gets
it imported) and torch (the CPU and every CUDA device) start from `SEED`, the same in the
reference run and in every trial. The program's own `torch.manual_seed(...)` runs after, and wins.
`Workspace` also fixes `PYTHONHASHSEED` (the order sets of strings iterate in) unless the user set
it. Only proof runs are seeded: `run`, `audit` and `watch` leave the program's randomness alone.

What seeds do not fix is watched while a proof child runs (`Unseeded`): the first line of the
user's own code that calls, itself, the clock (`time.time`, `time.time_ns`), `os.urandom`, `uuid`
(`uuid1`, `uuid4`) or a network connection (`socket.socket.connect`); the same calls made inside
a library (torch timing itself) are not the program's. When the intended program does not compute
the same values twice from the same seeds, those are what `fix` names as the reason no fix can be
proven.
"""

from __future__ import annotations

import enum
import functools
import os
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

from ...trace.places.user_files import is_user_file

SEED = 0
HASH_SEED = "0"


def seed() -> None:
    """Seed `random`, NumPy's global generator (where NumPy was importable) and torch with `SEED`."""
    random.seed(SEED)
    if "numpy" in sys.modules:  # torch imports it where it is installed; a missing one is never tried again
        import numpy.random

        numpy.random.seed(SEED)
    torch.manual_seed(SEED)  # every CUDA device too (lazily, where CUDA is not initialised yet)


class Source(enum.StrEnum):
    """The kinds of thing a program reads that seeds do not fix."""

    CLOCK = "clock"
    URANDOM = "urandom"
    UUID = "uuid"
    NETWORK = "network"


# (module or class, attribute, the kind of source it reads)
_WATCHED: tuple[tuple[Any, str, str], ...] = (
    (time, "time", Source.CLOCK),
    (time, "time_ns", Source.CLOCK),
    (os, "urandom", Source.URANDOM),
    (uuid, "uuid1", Source.UUID),
    (uuid, "uuid4", Source.UUID),
    (socket.socket, "connect", Source.NETWORK),
)


class Unseeded:
    """While in: the first line of the user's code to call each watched function (module docstring),
    as `reads`: (kind, function, file, line). Each call passes through unchanged."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str, str, int]] = []
        self._seen: set[str] = set()
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> Unseeded:
        for owner, name, kind in _WATCHED:
            original = getattr(owner, name, None)
            if original is None:
                continue
            setattr(owner, name, self._watched(original, kind, f"{getattr(owner, '__name__', owner)}.{name}"))
            self._undo.append(functools.partial(setattr, owner, name, original))
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _watched(self, original: Callable[..., Any], kind: str, called: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if called not in self._seen:
                frame = sys._getframe(1)
                if is_user_file(frame.f_code.co_filename):  # the program's own call (uuid4's urandom is uuid's)
                    self._seen.add(called)
                    self.reads.append((str(kind), called, frame.f_code.co_filename, frame.f_lineno))
            return original(*args, **kwargs)

        return call
