"""The fast tracer's `InplaceCalls` mode, on the stack only while it has something to do (issue 26).

`InplaceCalls` is a `TorchFunctionMode`: on the stack, every torch-level call
of the program enters Python (an empty pass-through mode alone costs about
13 % of a small MLP's step). It has work only at an in-place call
(`inplace=True`, or `x += y` into a plain name in the user's file) and, after
one, while a read of what it overwrote (`overwritten`, IPD105) or of a
caller's tensor it wrote (`CallerReads.awaiting`, IPD106) is awaited. So the
fast tracer (without fail-fast, whose mode settles writes at every call)
pushes it only then:

- the entry points of such calls are wrapped while a session runs (shared
  patches: the first session installs, the last uninstalls; a wrapper asks the
  sessions of the calling thread): the augmented methods of `torch.Tensor`
  (`__iadd__`, ...) and each function of `torch.nn.functional` that takes an
  `inplace` parameter (found by its signature). A call with `inplace=True`, or
  an augmented assignment into a plain name in a user file, pushes the mode
  before it runs; the mode then sees the call exactly as when it is always on;
- the mode stays while something is awaited, and is popped at the next safe
  point where nothing is: a wrapper's entry or return, or a top-level module's
  return (never inside the mode's own handler, a weakref callback or backward,
  whose end puts the thread's mode stack back as it was when it began);
- it is pushed at the place it had when always on: below the modes the
  program entered after the session began (they are lifted off and put back),
  above older sessions'.

Known limitations: an `inplace=True` call through a function object bound
before the session began (`from torch.nn.functional import relu` at import,
`self.act = F.relu` in `__init__`) does not pass the wrapper: while nothing is
awaited, such a call is not seen (no IPD105/IPD106 from it); `nn.ReLU(inplace=True)`
and the other modules look up `F.relu` at each call and are seen. An in-place call
inside backward (a custom `Function`'s) pushes nothing.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import sys
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .. import _compat
from .blame import passed_through
from .inplace_calls import ENTRY_CODES, InplaceCalls, _augmented_target
from .shared_patches import ABSENT, SharedPatch
from .stacks import is_user_file

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

    def __enter__(self) -> "InplaceEntries":
        self._order = next(_orders)
        self._base = sum(1 for i in range(_stack_length()) if id(_stack_at(i)) not in _ENTERED)
        _ENTERED[id(self.calls)] = self._order
        try:
            for patch in _PATCHES:
                patch.acquire(self)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """The mode taken off wherever it is; torch's functions put back when the last session ends."""
        try:
            if self.pushed:
                self._remove()
                self.pushed = False
        finally:
            _ENTERED.pop(id(self.calls), None)
            for patch in _PATCHES:
                patch.release(self)

    def awaited(self) -> bool:
        calls = self.calls
        return bool(calls.overwritten or calls.suspects is not None and calls.suspects.awaiting)

    def want(self) -> bool:
        """Before an in-place call: push the mode; whether this call pushed it."""
        if self.pushed or _compat.current_autograd_node() is not None:
            return False
        self._insert()
        return True

    def sync(self) -> None:
        """At a safe point: the mode on while a read is awaited, off when none is."""
        if _compat.current_autograd_node() is not None:
            return
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
        _push(self.calls)
        for mode in reversed(above):
            _push(mode)
        self.pushed = True
        self.pushes += 1

    def _remove(self) -> None:
        """Take the mode off, the modes above it lifted off and put back; not when it is not on the
        stack (inside its own handler, torch has set it aside and puts it back after)."""
        length = _stack_length()
        for at in range(length - 1, -1, -1):
            if _stack_at(at) is self.calls:
                break
        else:
            return
        above = [_pop() for _ in range(length - 1 - at)]
        _pop()
        for mode in reversed(above):
            _push(mode)
        self.pushed = False


def _settle(sessions: list[InplaceEntries]) -> None:
    for session in sessions:
        if session.pushed and not session.awaited():
            session.sync()


def _flag_entry(patch: Callable[[], SharedPatch[InplaceEntries]], index: int) -> Callable[[Any], Any]:
    """A `torch.nn.functional` function with an `inplace` parameter (at `index`): a call with
    `inplace=True` runs under the mode of each session of the calling thread.

    The wrapper runs in `torch.nn.functional`'s globals and names torch's function as its
    `__wrapped__`: `torch.jit.script` code calling it compiles torch's function's source (found
    through `__wrapped__`) with the names that source uses, as without the tool."""

    def wrap(original: Any) -> Any:
        if original is ABSENT:
            return None
        settle, through = _settle, passed_through  # the wrapper reads no global of this module

        def entry(*args: Any, **kwargs: Any) -> Any:
            sessions = patch().here()
            if sessions:
                flag = kwargs["inplace"] if "inplace" in kwargs else args[index] if len(args) > index else False
                if flag is True:
                    pushed = [session for session in sessions if session.want()]
                    try:
                        return original(*args, **kwargs)
                    except BaseException as exc:
                        through(exc)
                        raise
                    finally:
                        settle(pushed)
                settle(sessions)
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                through(exc)
                raise

        in_torchs = types.FunctionType(entry.__code__, vars(F), original.__name__, None, entry.__closure__)
        return functools.update_wrapper(in_torchs, original)

    return wrap


def _augmented_entry(patch: Callable[[], SharedPatch[InplaceEntries]], name: str) -> Callable[[Any], Any]:
    """`torch.Tensor.__iadd__` and its kin: `x += y` into a plain name in a user file runs under
    the mode of each session of the calling thread, which sees it as always (the in-place method)."""

    def wrap(original: Any) -> Any:
        if original is ABSENT:
            original = getattr(torch.Tensor, name)

        def augmented(self: Any, other: Any) -> Any:
            sessions = patch().here()
            pushed: list[InplaceEntries] = []
            if sessions:
                caller = sys._getframe(1)
                if is_user_file(caller.f_code.co_filename) and _augmented_target(caller) is False:
                    pushed = [session for session in sessions if session.want()]
                else:
                    _settle(sessions)
            try:
                return original(self, other)
            except BaseException as exc:
                passed_through(exc)
                raise
            finally:
                if pushed:
                    _settle(pushed)

        augmented.__wrapped__ = original  # type: ignore[attr-defined]
        augmented.__name__ = augmented.__qualname__ = name
        return augmented

    return wrap


_AUGMENTED = [
    name for name in dir(torch.Tensor)
    if name.startswith("__i") and name[3:-2] in (
        "add", "sub", "mul", "div", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
        "rshift",
    )
]


def _flag_functions() -> dict[str, int]:
    """`torch.nn.functional`'s functions with an `inplace` parameter: name -> its position."""
    found = {}
    for name, value in vars(F).items():
        if inspect.isfunction(value) and getattr(value, "__module__", "") == F.__name__:
            parameters = list(inspect.signature(value).parameters)
            if "inplace" in parameters:
                found[name] = parameters.index("inplace")
    return found


_PATCHES: list[SharedPatch[InplaceEntries]] = []


def _add(owner: Any, name: str, make: Callable[[Callable[[], SharedPatch[InplaceEntries]]], Callable[[Any], Any]]) -> None:
    at = len(_PATCHES)
    _PATCHES.append(SharedPatch(owner, name, make(lambda: _PATCHES[at])))


for _name in _AUGMENTED:
    _add(torch.Tensor, _name, lambda patch, name=_name: _augmented_entry(patch, name))  # type: ignore[misc]
for _name, _index in _flag_functions().items():
    _add(F, _name, lambda patch, index=_index: _flag_entry(patch, index))  # type: ignore[misc]


def _entry_codes() -> None:
    ENTRY_CODES.add(_augmented_entry(lambda: _PATCHES[0], "__iadd__")(torch.Tensor.__iadd__).__code__)


_entry_codes()

__all__ = ["InplaceEntries"]
