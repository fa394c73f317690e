"""What the tracer's parts share: the `TraceOwner` its helpers see, the busy flag, the sink type.

The helpers that watch the user's calls (`InplaceCalls`, `HeldTensors`) do not
know the `Tracer`: they receive it as a `TraceOwner`, three members wide, the
way `torch.utils.flop_counter`'s private mode calls back into its owner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..events import Event

#: Receives each event; may return an exception for the tracer to raise at that point.
Sink = Callable[[Event], "BaseException | None"]


class TraceOwner(Protocol):
    """The tracer, as the helpers it owns may use it."""

    @property
    def busy(self) -> bool:
        """Whether the tracer is running torch calls of its own: helpers let them through unobserved."""
        ...

    def emit(self, event: Event) -> None:
        """Report an event; raises what the sink returns (fail-fast, or a stale tensor's error)."""
        ...

    def user_call_returned(self) -> None:
        """A user-level torch call returned: with fail-fast, its writes are settled now."""
        ...

    def call_raised(self, exc: BaseException, func: Any, target: Any, flag: bool = False) -> None:
        """A user-level torch call on `target` raised `exc` before the dispatcher saw an op (autograd's
        view and leaf checks): note which call, and where `target`'s autograd node was created.
        `flag`: the call was asked to work in place (`inplace=True`)."""
        ...


class Busy:
    """Set while the tracer runs torch calls of its own (`with busy:`); its modes pass them through."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False

    def __enter__(self) -> None:
        self.on = True

    def __exit__(self, *exc: object) -> None:
        self.on = False
