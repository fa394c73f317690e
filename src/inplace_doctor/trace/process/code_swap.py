"""Torch's functions whose `__code__` is swapped for an entry code of the same signature while a session runs.

The function object stays torch's: `activation is F.relu` holds, references bound before the
session (`self.act = F.relu`, a subclass's `super().forward(...)`) see the calls, and
`torch.jit.script` reads torch's source from the function's file and line. The entry code runs
`return <entry name>(<key>...)(<its arguments>)`: what the entry returns (torch's code, a function
of its own, or a wrapper around it) gets the call. The entry name is set in the function's globals
while a session is in; a call of another thread that began just as the last session left finds it
gone and runs torch's code (not the function again: a code another tool swapped in over the
entry, a copy of it, stays after the session and would call itself). Used by `inplace_entry`
(`torch.nn.functional`'s functions with an `inplace` parameter) and `fast_paths` (the `forward`
of the modules with a fused inference path).
"""

from __future__ import annotations

import types
from typing import Any, TypeVar

from .shared_patches import Shared

U = TypeVar("U")


class SwappedCodes(Shared[U]):
    """Functions whose code is the entry code while at least one user is in (`Shared`); `body(key,
    ...)` is function `key`'s own code, whatever the sessions. A subclass finds its functions in
    `_prepare` (run at the first install) and adds each with `add`."""

    def __init__(self, entry_name: str, fallback: str) -> None:
        super().__init__()
        self._entry_name = entry_name
        self._fallback = fallback  # an expression for `body`, importable without the entry name
        self.functions: list[Any] = []
        self.codes: list[tuple[Any, Any]] = []  # (torch's code, the entry code)
        self.bodies: list[Any] = []  # torch's code as a function of its own

    def _prepare(self) -> None:
        raise NotImplementedError

    def entry(self, key: int, *args: Any) -> Any:
        raise NotImplementedError

    def add(self, value: types.FunctionType, names: list[str], extra: str = "") -> None:
        """Swap `value` (its parameters `names`, all positional-or-keyword) while a session is in; the
        entry code calls `entry(key{extra})`, `extra` naming more of its parameters (`, inplace`)."""
        key, arguments = len(self.functions), ", ".join(names)
        source = (
            f"def {value.__name__}({arguments}):\n    try:\n        entered = {self._entry_name}\n"
            f"    except NameError:\n        entered = {self._fallback}\n"
            f"    return entered({key}{extra})({arguments})\n"
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, value.__code__.co_filename, "exec"), namespace)  # noqa: S102 (our own text)
        code = value.__code__
        entry = namespace[value.__name__].__code__.replace(
            co_filename=code.co_filename, co_name=code.co_name, co_firstlineno=code.co_firstlineno,
            **({"co_qualname": code.co_qualname} if hasattr(code, "co_qualname") else {}),
        )
        body = types.FunctionType(code, value.__globals__, value.__name__, value.__defaults__)
        body.__kwdefaults__ = value.__kwdefaults__
        self.functions.append(value)
        self.codes.append((code, entry))
        self.bodies.append(body)

    def install(self) -> None:
        if not self.functions:
            self._prepare()
        for function, (_, entry) in zip(self.functions, self.codes):
            function.__globals__[self._entry_name] = self.entry
            function.__code__ = entry

    def uninstall(self) -> None:
        for function, (code, entry) in zip(self.functions, self.codes):
            if function.__code__ is entry:
                function.__code__ = code
            if function.__globals__.get(self._entry_name) == self.entry:
                del function.__globals__[self._entry_name]

    def body(self, key: int, *args: Any) -> Any:
        """Torch's code of function `key`, whatever the sessions."""
        return self.bodies[key]
