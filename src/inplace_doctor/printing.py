"""The one seam between a result and its text: `str(result)` asks the renderer registered for its type.

Results (`Report`, `MemoryReport`, `Plan`, `VerifyResult`) live below `render/` and import no
renderer. Each renderer module registers its plain-text (and, where it has one, notebook HTML)
function for the result types it formats, with `@renders_text(Report)`; the package's
`__init__` imports `render/`, so every result a user can hold prints. Results inherit
`Printable` to get `__str__` and `_repr_html_` through this registry. `fmt_bytes` is the
one byte format every result's message and renderer shares.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

_TEXT: dict[type, Callable[[Any], str]] = {}
_HTML: dict[type, Callable[[Any], str]] = {}

F = TypeVar("F", bound=Callable[..., str])


def renders_text(*types: type) -> Callable[[F], F]:
    """Register the decorated function as the plain text of `types` (what `str()` returns)."""

    def register(fn: F) -> F:
        _TEXT.update((t, fn) for t in types)
        return fn

    return register


def renders_html(*types: type) -> Callable[[F], F]:
    """Register the decorated function as the notebook view of `types` (`_repr_html_`)."""

    def register(fn: F) -> F:
        _HTML.update((t, fn) for t in types)
        return fn

    return register


def _lookup(table: dict[type, Callable[[Any], str]], obj: object) -> Callable[[Any], str] | None:
    return next((table[klass] for klass in type(obj).__mro__ if klass in table), None)


def fmt_bytes(n: int) -> str:
    """`1536` -> `1.50 KiB`; exact bytes below 1 KiB."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{n} B"


class Printable:
    """Mixin for results: `str()` and Jupyter's `_repr_html_` go through the registered renderers."""

    def __str__(self) -> str:
        text = _lookup(_TEXT, self)
        if text is None:
            raise LookupError(f"no text renderer is registered for {type(self).__name__}: import inplace_doctor.render")
        return text(self)

    def _repr_html_(self) -> str | None:
        """The registered notebook view; None (IPython then shows `str()`) for a type without one."""
        html = _lookup(_HTML, self)
        return html(self) if html is not None else None


def encodable(text: str, stream: Any) -> str:
    """`text` as `stream` can write it: a file name that is not valid UTF-8 (held as surrogate
    escapes) shows as `\\udcff` instead of raising UnicodeEncodeError on a strict stream."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # a stream naming an encoding Python does not know
        pass
    return text
