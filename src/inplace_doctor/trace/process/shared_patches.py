"""Process-wide changes the sessions share: made by the first session in, undone by the last out, in any order.

A session that saves an attribute of torch, sets its own wrapper and sets the saved value back on
exit undoes it wrongly when sessions of two threads end out of order: A saves torch's function, B
saves A's wrapper; A ends and sets torch's back, B ends and sets A's wrapper back, where it stays
for good (seen as `torch.compile` running eagerly in later code, a TorchFunctionMode seeing more
calls). So each such change is one `Shared` object per process: the first `acquire` makes it
(`install`), each session in is one of its `users`, the `release` that leaves none undoes it
(`uninstall`), whichever session that is. A `SharedPatch` is one attribute: its one wrapper asks at
each call which sessions are in (`users`, or `here()`: those entered on the calling thread), and
the attribute is torch's own again once the last has left.

Forks: each `Shared`'s lock is taken across `os.fork()`, as `kernel_registration.py` takes its own,
so a child (a DataLoader worker) never starts with the lock of a change another thread was making
held for good. The child runs only the thread that forked: the sessions of the other threads leave
its copy (a change none is left in is undone), as their thread's later ids may be its new threads'.
"""

from __future__ import annotations

import os
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

U = TypeVar("U")

ABSENT: Any = object()  # an attribute the owner only inherits: deleted again, not set


class Shared(Generic[U]):
    """A process-wide change, made while at least one user is in (`install` / `uninstall`)."""

    def __init__(self, install: Callable[[], None] | None = None, uninstall: Callable[[], None] | None = None) -> None:
        self._install = install
        self._uninstall = uninstall
        self._lock = threading.Lock()
        _LOCKED.add(self)
        #: (thread ident, user) of each session in, oldest first; replaced, never changed in place,
        #: so a wrapper reads it without the lock
        self.entries: tuple[tuple[int, U], ...] = ()

    @property
    def users(self) -> list[U]:
        """The sessions in, in any thread, oldest first."""
        return [user for _, user in self.entries]

    def here(self) -> list[U]:
        """The sessions entered on the calling thread, oldest first."""
        entries = self.entries
        if not entries:
            return []
        me = threading.get_ident()
        return [user for thread, user in entries if thread == me]

    def acquire(self, user: U) -> None:
        with self._lock:
            first = not self.entries
            self.entries = (*self.entries, (threading.get_ident(), user))
            if first:
                try:
                    self.install()
                except BaseException:
                    self.entries = ()
                    raise

    def release(self, user: U) -> None:
        """`user` leaves (a user not in is ignored); the change is undone when none is left."""
        with self._lock:
            kept = tuple(entry for entry in self.entries if entry[1] is not user)
            if len(kept) == len(self.entries):
                return
            self.entries = kept
            if not kept:
                self.uninstall()

    def install(self) -> None:
        if self._install is not None:
            self._install()

    def uninstall(self) -> None:
        if self._uninstall is not None:
            self._uninstall()


class SharedPatch(Shared[U]):
    """`owner.name` replaced by `wrap(original)` while at least one user is in, then torch's own again.

    `wrap` gets the value `owner` itself holds (`ABSENT` when it only inherits it) and returns what
    to set, or None to leave the attribute alone (someone else's patch is there). The original is
    put back only while the wrapper is still in place: a wrapper another tool set over it later is
    not taken away (ours then passes calls through, with no user in).

    The wrapper made for one of torch's own values is set again by later sessions while the
    attribute (own or inherited) is that same value (a wrapper holds what it wraps: another tool's
    function is wrapped anew, never kept); `reuse=False` for a `wrap` that depends on more than the
    value it wraps."""

    def __init__(self, owner: Any, name: str, wrap: Callable[[Any], Any], reuse: bool = True) -> None:
        super().__init__()
        self._reuse = reuse
        self.owner = owner
        self.name = name
        self._wrap = wrap
        self._original: Any = ABSENT
        self._wrapper: Any = None
        #: (a weak reference to the wrapper last set; a reference to the value it replaced): found in
        #: place when the first session enters, the program set it back (saved while a session ran,
        #: restored after, as pytest's `monkeypatch` undone after the watch): it stands for that value
        self._set: tuple[Callable[[], Any], Callable[[], Any]] | None = None
        #: (a reference to the value last wrapped, own or inherited; its wrapper)
        self._made: tuple[Callable[[], Any], Any] | None = None

    def install(self) -> None:
        original = self.owner.__dict__.get(self.name, ABSENT)
        if self._set is not None and original is not ABSENT and self._set[0]() is original:
            replaced = self._set[1]()  # our own wrapper, restored by the program: what it replaced
            original = original if replaced is None else replaced
        wrapped = getattr(self.owner, self.name, ABSENT) if original is ABSENT else original
        made = self._made
        if made is not None and made[0]() is wrapped and wrapped is not ABSENT:
            wrapper = made[1]
        else:
            wrapper = self._wrap(original)
            if wrapper is None:
                return
            _name_as_set(wrapper, self.owner, self.name)
            self._made = (_reference(wrapped), wrapper) if self._reuse and _torchs(wrapped) else None
        self._original, self._wrapper = original, wrapper
        try:
            self._set = (weakref.ref(wrapper), _reference(original))
        except TypeError:  # a property, a staticmethod: not recognised when set back
            self._set = None
        setattr(self.owner, self.name, wrapper)

    def uninstall(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        original, self._original = self._original, ABSENT
        if wrapper is None or self.owner.__dict__.get(self.name, ABSENT) is not wrapper:
            return
        if original is ABSENT:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, original)

    @property
    def wrapper(self) -> Any:
        """What is set while installed, else None."""
        return self._wrapper


def _name_as_set(wrapper: Any, owner: Any, name: str) -> None:
    """A wrapper function named by where it is set (`torch.save`, `torch._tensor.Tensor.numpy`), so
    pickle finds it there by reference, as it finds torch's own (`pool.apply_async(torch.save, ...)`
    in a watch)."""
    if not isinstance(wrapper, types.FunctionType):
        return
    if isinstance(owner, types.ModuleType):
        wrapper.__module__, wrapper.__qualname__ = owner.__name__, name
    elif isinstance(owner, type):
        wrapper.__module__, wrapper.__qualname__ = owner.__module__, f"{owner.__qualname__}.{name}"


def _torchs(value: Any) -> bool:
    """Whether `value` is torch's own (kept alive by torch anyway): a C-level descriptor of its classes
    (`wrapper_descriptor`, `getset_descriptor`, no `__module__`) or a function of its modules."""
    module = getattr(value, "__module__", None)
    if module is None:
        return isinstance(value, _DESCRIPTORS)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


_DESCRIPTORS = (
    types.WrapperDescriptorType, types.MethodDescriptorType, types.GetSetDescriptorType,
    types.MemberDescriptorType, types.BuiltinFunctionType,
)


def _reference(value: Any) -> Callable[[], Any]:
    """A weak reference where `value` takes one, else `value` itself (torch's C descriptors)."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


class SharedGroup(Shared[U]):
    """Several changes one kind of session always makes together (`parts`), made by the first session
    in and undone by the last out: one lock and one list of sessions for all of them, where a part
    each would cost a session an acquire and a release per part (about 2 µs each, besides the
    change itself). Each part's `entries` is kept the group's, so its wrapper's `here()` and
    `users` answer as if the session had entered it alone."""

    def __init__(self, parts: list[Shared[U]]) -> None:
        self.parts = parts
        super().__init__()

    @property  # type: ignore[override]
    def entries(self) -> tuple[tuple[int, U], ...]:
        return self._entries

    @entries.setter
    def entries(self, entries: tuple[tuple[int, U], ...]) -> None:
        self._entries = entries
        for part in self.parts:
            part.entries = entries

    def install(self) -> None:
        done: list[Shared[U]] = []
        try:
            for part in self.parts:
                part.install()
                done.append(part)
        except BaseException:
            for part in reversed(done):
                part.uninstall()
            raise

    def uninstall(self) -> None:
        for part in self.parts:
            part.uninstall()


#: each `Shared` (a group's parts too, whose locks are never held: taking them costs nothing)
_LOCKED: weakref.WeakSet[Shared[Any]] = weakref.WeakSet()
_HELD: list[Shared[Any]] = []  # the locks taken before a fork, released after it in the parent


def _before_fork() -> None:
    # one lock at a time is all any thread holds (an `install` takes no other): no order to keep
    _HELD[:] = list(_LOCKED)
    for shared in _HELD:
        shared._lock.acquire()


def _after_fork_in_parent() -> None:
    for shared in _HELD:
        shared._lock.release()
    _HELD.clear()


def _after_fork_in_child() -> None:
    """The child runs the forking thread alone: the sessions of the others (which can never end in
    it, and whose thread ids its new threads may reuse) leave, and a change none is left in is undone."""
    for shared in _HELD:
        shared._lock = threading.Lock()  # the copy is held by the thread that forked
    parts = {id(part) for shared in _HELD if isinstance(shared, SharedGroup) for part in shared.parts}
    me = threading.get_ident()
    for shared in _HELD:
        kept = tuple(entry for entry in shared.entries if entry[0] == me)
        if id(shared) not in parts and len(kept) != len(shared.entries):
            shared.entries = kept
            if not kept:
                shared.uninstall()
    _HELD.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


__all__ = ["ABSENT", "Shared", "SharedGroup", "SharedPatch"]
