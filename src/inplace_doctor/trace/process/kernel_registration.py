"""The write kernels' process-wide registration: held by sessions, kept a moment after the last one.

Registering the ~1450 kernels costs about 15 ms and removing them 3 ms, so a
`watch` opened per training step would pay both every step. The registration
therefore lingers `LINGER_SECONDS` after the last session leaves: a session
entered within that time finds it registered. A daemon thread removes it
when the time has passed with no session; `end_linger()` removes it at once
(tests, a deep session, interpreter exit). While it lingers, a write runs
through a kernel that finds no session and calls PyTorch's own
`ADInplaceOrView` kernel from Python (a few µs more per write; see
`write_kernels.py`).

Removal is made safe for threads that write meanwhile. PyTorch's dispatcher
frees a Python kernel's holder (`PythonKernelHolder`) when its registration
is removed, and a thread that looked the kernel up before the removal and
waits for the GIL then reads the freed holder (seen here: "interpreter ==
pyinterpreter_ INTERNAL ASSERT FAILED", or the kernel called without its
keyset). So before removing, the computed kernel of each registration is
copied (`_SafeKernelFunction`, which holds the holder), and those copies are
kept until the next removal. A count of kernels in flight would not do: such
a thread has not entered Python yet. What stays unsafe is PyTorch's own: the
dispatcher does not synchronise a registration change with a thread reading
the same table entry in that instant.

Forks: a child (a DataLoader worker) has no linger thread and removes a
lingering registration at once, so its writes run PyTorch's kernels, as it
does one held only by sessions of threads other than the one that forked
(the child does not run them); the lock is taken across the fork so the
child's is in a known state.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

#: how long the kernels stay registered after the last session ends, in seconds (0: removed at once)
LINGER_SECONDS = 1.0
#: what registering over PyTorch's own ADInplaceOrView kernels prints, once per process
OVERRIDE_WARNING = r"Warning only once for all operators, other operators may also be overridden"
_computed_kernel = getattr(torch._C, "_dispatch_get_computed_kernel_for_dispatch_key", None)


class Registration:
    """The library of kernels `build()` returns ((op, kernel) pairs, built once per process),
    registered while a user holds it and for `LINGER_SECONDS` after the last one leaves."""

    def __init__(self, build: Callable[[], list[tuple[Any, Callable[..., Any]]]]) -> None:
        self._build = build
        self.kernels: list[tuple[Any, Callable[..., Any]]] | None = None
        self.library: Any = None
        self.count = 0  # kernels registered now
        self.registrations = 0  # times registered in this process: a watch per step registers once
        self._threads: list[int] = []  # the thread each user entered on (a fork keeps the forking one's)
        self._deadline: float | None = None  # while lingering: when to remove (time.monotonic)
        self._timer: threading.Thread | None = None
        #: when the timer wakes by itself (None: it waits with no deadline, for `release`); woken at an
        #: earlier deadline, it waits again for the later one: a watch per step wakes it once a linger
        self._wakes_at: float | None = None
        self.wake_ups = 0  # times `release` woke the timer (the tests read it)
        self._retired: list[Any] = []  # the last removed registration's holders, kept alive
        self._reset_lock()

    @property
    def users(self) -> int:
        """The sessions holding the registration now."""
        return len(self._threads)

    def _reset_lock(self) -> None:
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)

    def acquire(self) -> None:
        with self.lock:
            self._threads.append(threading.get_ident())
            self._deadline = None
            if self.library is not None:
                return
            if self.kernels is None:
                self.kernels = self._build()
            library = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=OVERRIDE_WARNING)
                for op, kernel in self.kernels:
                    library.impl(op, kernel, "ADInplaceOrView", with_keyset=True)
            self.library, self.count = library, len(self.kernels)
            self.registrations += 1

    def release(self) -> None:
        with self.lock:
            me = threading.get_ident()
            if self._threads:  # a user may leave from another thread than it entered on
                self._threads.remove(me if me in self._threads else self._threads[0])
            if self.users or self.library is None:
                return
            if LINGER_SECONDS <= 0:
                self._remove()
                return
            self._deadline = time.monotonic() + LINGER_SECONDS
            if self._timer is None:
                self._timer = threading.Thread(target=self._linger, name="inplace-doctor-linger", daemon=True)
                self._timer.start()
            elif self._wakes_at is None or self._wakes_at > self._deadline:
                # a timer waiting on an earlier deadline wakes then and waits again: a wake-up per
                # session would hand the timer thread the GIL each time (about 70 µs a session)
                self._wakes_at = None
                self.wake_ups += 1
                self._wake.notify()

    def end_linger(self) -> None:
        """Remove the kernels now if no session holds them."""
        with self.lock:
            if self.users == 0 and self.library is not None:
                self._remove()

    def _linger(self) -> None:
        """The timer thread: removes the registration once its deadline passed with no session.
        It runs no op: only the dispatcher's registration calls, under this lock."""
        with self.lock:
            while True:
                if self._deadline is None:
                    self._wakes_at = None
                    self._wake.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._wakes_at = self._deadline
                    self._wake.wait(left)
                elif self.users == 0 and self.library is not None:
                    self._remove()
                else:
                    self._deadline = None

    def _remove(self, other_threads: bool = True) -> None:
        """With the lock held and no user: the kernels taken out of the dispatcher."""
        if other_threads and _computed_kernel is not None and self.kernels is not None:
            key = torch._C.DispatchKey.ADInplaceOrView
            self._retired = [_computed_kernel(op._name, key) for op, _ in self.kernels]
        self.library._destroy()
        self.library, self.count, self._deadline = None, 0, None

    def _before_fork(self) -> None:
        self.lock.acquire()

    def _after_fork_in_parent(self) -> None:
        self.lock.release()

    def _after_fork_in_child(self) -> None:
        self._reset_lock()  # the child's copy is held by the thread that forked, as the parent's was
        self._timer = None  # not carried over the fork
        self._wakes_at = None
        me = threading.get_ident()
        self._threads = [thread for thread in self._threads if thread == me]  # the others' never end here
        if self.users == 0 and self.library is not None:
            self._remove(other_threads=False)  # the child runs one thread: nothing can be in a kernel


def registration(build: Callable[[], list[tuple[Any, Callable[..., Any]]]]) -> Registration:
    """A `Registration`, removed at interpreter exit and at fork in a child that does not hold it."""
    made = Registration(build)
    atexit.register(made.end_linger)
    os.register_at_fork(
        before=made._before_fork, after_in_parent=made._after_fork_in_parent,
        after_in_child=made._after_fork_in_child,
    )
    return made


__all__ = ["LINGER_SECONDS", "OVERRIDE_WARNING", "Registration", "registration"]
