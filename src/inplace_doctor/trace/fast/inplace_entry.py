"""The fast tracer's `InplaceCalls` mode, on the stack only while it has something to do (issue 26).

`InplaceCalls` is a `TorchFunctionMode`: on the stack, every torch-level call
of the program enters Python (an empty pass-through mode alone costs about
13 % of a small MLP's step). It has work only at an in-place call
(`inplace=True`, or `x += y` into a plain name in the user's file) and, after
one, while a read of what it overwrote (`overwritten`, IPD105) or of a
caller's tensor it wrote (`CallerReads.awaiting`, IPD106) is awaited. So the
fast tracer (without fail-fast, whose mode settles writes at every call)
pushes it only then:

- the entry points of such calls are watched while a session runs (first
  session in installs, last out uninstalls; the entry asks the sessions of the
  calling thread): the augmented methods of `torch.Tensor` (`__iadd__`, ...,
  patched attributes), and each function of `torch.nn.functional` that takes
  an `inplace` parameter (found by its signature), whose `__code__` is swapped
  for an entry code of the same signature: the function object stays torch's,
  so references bound before the session (`from torch.nn.functional import
  relu`, `self.act = F.relu`) are seen too, `activation is F.relu` holds and
  `torch.jit.script` reads torch's source. A call with `inplace=True`, or an
  augmented assignment into a plain name in a user file, pushes the mode
  before it runs; the mode then sees the call exactly as when it is always on;
- the mode stays while something is awaited, and is popped at the next safe
  point where nothing is: a wrapper's entry or return, or a top-level module's
  return (never inside the mode's own handler, a weakref callback or backward,
  whose end puts the thread's mode stack back as it was when it began);
- it is pushed at the place it had when always on: below the modes the
  program entered after the session began (they are lifted off and put back),
  above older sessions'.

Known limitations: a function outside `torch.nn.functional` that takes
`inplace=True` through `__torch_function__` (none in torch) pushes nothing, and is
seen only while something is awaited, as is `x += y` on a Tensor subclass that
defines its own `__iadd__`; an in-place call inside backward (a custom
`Function`'s) pushes nothing, nor one of a `torch.nn.functional` function the
program replaced in the module, before the process's first session, by a wrapper
without `__wrapped__` (torch's function is found there only; one with
`functools.wraps` is seen through); `torch.compile` tracing `F.relu` while a session
runs in another thread traces the entry code (a session's own compiled code runs
eagerly, `compiled.py`).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
from typing import Any

import torch
import torch.nn.functional as F

from ... import _compat
from ..places.stacks import is_user_file
from ..process.code_swap import SwappedCodes
from ..process.shared_patches import ABSENT, SharedGroup, SharedPatch
from ..raised.blame import passed_through
from ..raised.pytorch_errors import in_place_name
from ..raised.raised_calls import note_raised
from ..reads.inplace_calls import ENTRY_CODES, InplaceCalls, _augmented_target

_stack_length = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_push = torch._C._push_on_torch_function_stack
_pop = torch._C._pop_torch_function_stack
_orders = itertools.count()
#: id(mode) -> the order its session entered in, for each session in (`InplaceEntries`)
_ENTERED: dict[int, int] = {}


class InplaceEntries:
    """Pushes `calls` while an in-place call runs or a read is awaited; pops it at a safe point after."""

    def __init__(self, calls: InplaceCalls) -> None:
        self.calls = calls
        #: whether the mode is on this thread's stack (or, inside its own handler, set aside by torch)
        self.pushed = False
        #: times the mode was pushed (the tests and the report's statistics may read it)
        self.pushes = 0
        self._order = 0
        self._base = 0  # the foreign modes on the stack when the session began
        #: the program's mode right below ours while ours is on the stack (none can leave before ours),
        #: and one the program exited while ours was above it, not yet off the stack (`_mend`)
        self._below: Any = None
        self._exited: Any = None

    def __enter__(self) -> InplaceEntries:
        self._order = next(_orders)
        self._base = sum(1 for i in range(_stack_length()) if id(_stack_at(i)) not in _ENTERED)
        _ENTERED[id(self.calls)] = self._order
        try:
            _SHARED.acquire(self)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """The mode taken off wherever it is; torch's functions put back when the last session ends."""
        try:
            self._mend()
            if self.pushed:
                self._remove()
                self.pushed = False
        finally:
            _ENTERED.pop(id(self.calls), None)
            _SHARED.release(self)

    def awaited(self) -> bool:
        calls = self.calls
        return bool(calls.overwritten or calls.suspects is not None and calls.suspects.awaiting)

    def want(self) -> bool:
        """Before an in-place call: push the mode; whether this call pushed it."""
        if _compat.current_autograd_node() is not None:
            return False
        if self.pushed or self._exited is not None:
            self._mend()
        if self.pushed:
            return False
        self._insert()
        return True

    def sync(self) -> None:
        """At a safe point: the mode on while a read is awaited, off when none is."""
        if _compat.current_autograd_node() is not None:
            return
        if self.pushed or self._exited is not None:
            self._mend()
        if self.awaited():
            if not self.pushed:
                self._insert()
        elif self.pushed:
            self._remove()

    def _insert(self) -> None:
        """Push the mode where it would be had it been pushed when the session began."""
        length = _stack_length()
        at, foreign = 0, 0
        while at < length:
            order = _ENTERED.get(id(_stack_at(at)))
            if order is None:
                if foreign == self._base:
                    break  # a mode the program entered since the session began: ours goes below it
                foreign += 1
            elif order > self._order:
                break  # a later session's
            at += 1
        above = [_pop() for _ in range(length - at)]
        below = _stack_at(at - 1) if at else None
        self._below = below if below is not None and id(below) not in _ENTERED else None
        _push(self.calls)
        for mode in reversed(above):
            _push(mode)
        self.pushed = True
        self.pushes += 1

    def _mend(self) -> None:
        """A mode the program entered before ours and exited while ours was above it popped ours
        (torch's `__exit__` pops the top): ours, pushed but off the stack outside its own handler,
        is taken as off, and the mode the program meant to exit goes at the first safe point it is
        on the stack (not while its own handler runs: torch has set it aside then)."""
        calls = self.calls
        if self.pushed and not calls.handling and not any(_stack_at(i) is calls for i in range(_stack_length())):
            self.pushed, self._exited, self._below = False, self._below, None
        if self._exited is not None and _take_off(self._exited):
            self._exited = None

    def _remove(self) -> None:
        """Take the mode off, the modes above it lifted off and put back; not when it is not on the
        stack (inside its own handler, torch has set it aside and puts it back after)."""
        if _take_off(self.calls):
            self.pushed = False
            self._below = None


def _take_off(mode: Any) -> bool:
    """`mode` off this thread's stack, the modes above it lifted off and put back; whether it was on."""
    length = _stack_length()
    for at in range(length - 1, -1, -1):
        if _stack_at(at) is mode:
            break
    else:
        return False
    above = [_pop() for _ in range(length - 1 - at)]
    _pop()
    for above_mode in reversed(above):
        _push(above_mode)
    return True


def _settle(sessions: list[InplaceEntries]) -> None:
    for session in sessions:
        if session.pushed and not session.awaited():
            session.sync()


def _augmented_patch(name: str) -> SharedPatch[InplaceEntries]:
    """`torch.Tensor.__iadd__` and its kin: `x += y` into a plain name in a user file runs under
    the mode of each session of the calling thread, which sees it as always (the in-place method)."""

    op = f"aten.{in_place_name(name)}"

    def wrap(original: Any) -> Any:
        if original is ABSENT:  # inherited from `TensorBase`: deleted again after
            original = getattr(torch.Tensor, name)

        def augmented(self: Any, *args: Any, **kwargs: Any) -> Any:  # torch's take `alpha` too
            sessions = patch.here()
            pushed: list[InplaceEntries] = []
            if sessions:
                caller = sys._getframe(1)
                if is_user_file(caller.f_code.co_filename) and _augmented_target(caller) is False:
                    pushed = [session for session in sessions if session.want()]
                else:
                    _settle(sessions)
            try:
                return original(self, *args, **kwargs)
            except BaseException as exc:
                passed_through(exc)
                note_raised(exc, op, self)  # PyTorch refused it (a view of a leaf): the sessions note where
                raise
            finally:
                if pushed:
                    _settle(pushed)

        augmented.__wrapped__ = original  # type: ignore[attr-defined]
        # named where it is found, so `pickle` finds it there (by reference, as torch's own)
        augmented.__name__, augmented.__qualname__, augmented.__module__ = name, f"Tensor.{name}", torch.Tensor.__module__
        ENTRY_CODES.add(augmented.__code__)  # the mode looks past it for the program's frame
        return augmented

    patch: SharedPatch[InplaceEntries] = SharedPatch(torch.Tensor, name, wrap)
    return patch


_AUGMENTED = [
    name for name in dir(torch.Tensor)
    if name.startswith("__i") and name[3:-2] in (
        "add", "sub", "mul", "div", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
        "rshift",
    )
]
_PATCHES = [_augmented_patch(name) for name in _AUGMENTED]


_ENTRY = "_inplace_doctor_entry"  # the name the functions' entry code calls, in `torch.nn.functional`


def _unwrapped(value: Any) -> Any:
    """What a function wraps (`functools.wraps`: a program's wrapper set on `F` before the first
    session wraps torch's function, whose code is then the one swapped)."""
    if not inspect.isfunction(value):
        return value
    try:
        return inspect.unwrap(value)
    except ValueError:  # a cycle of `__wrapped__`
        return value


class _FlagFunctions(SwappedCodes[InplaceEntries]):
    """Each `torch.nn.functional` function with an `inplace` parameter runs, while a session is in,
    an entry code of the same signature (`code_swap.py`): `return _inplace_doctor_entry(k,
    inplace)(<its arguments>)`, which hands back torch's code (a copy of the function) to run,
    under the mode of each session of the calling thread when `inplace` is True."""

    def __init__(self) -> None:
        super().__init__(_ENTRY, f"__import__({__name__!r}, fromlist=['_FLAGS'])._FLAGS.body")

    def _prepare(self) -> None:
        found = [_unwrapped(v) for v in vars(F).values()]
        for value in {id(v): v for v in found}.values():
            if not (inspect.isfunction(value) and value.__module__ == F.__name__ and value.__closure__ is None):
                continue
            # the code's own signature: a wrapper's entry code could not call the wrapper's code
            parameters = inspect.signature(value, follow_wrapped=False).parameters
            names = list(parameters)
            if "inplace" not in names or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in parameters.values()):
                continue
            self.add(value, names, ", inplace")

    def entry(self, key: int, inplace: Any) -> Any:
        """What function `key` runs: torch's code, under the sessions' modes for `inplace=True`."""
        body = self.bodies[key]
        sessions = self.here()
        if not sessions:
            return body
        if inplace is True:
            pushed = [session for session in sessions if session.want()]
            return functools.partial(_run_pushed, body, pushed) if pushed else body
        _settle(sessions)
        return body


def _run_pushed(body: Any, pushed: list[InplaceEntries], *args: Any) -> Any:
    try:
        return body(*args)
    except BaseException as exc:
        passed_through(exc)
        raise
    finally:
        _settle(pushed)


_FLAGS = _FlagFunctions()
#: all the entry points, made and undone together (each part's wrapper asks its own `here()`)
_SHARED: SharedGroup[InplaceEntries] = SharedGroup([*_PATCHES, _FLAGS])

__all__ = ["InplaceEntries"]
