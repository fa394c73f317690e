"""The one seam between a result and its text: `str(result)` asks the renderer registered for its type.

Results (`Report`, `MemoryReport`, `Plan`, `VerifyResult`) live below `render/` and import no
renderer. Each renderer module registers its plain-text (and, where it has one, notebook HTML)
function for the result types it formats, with `@renders_text(Report)`; the package's
`__init__` imports `render/`, so every result a user can hold prints. Results inherit
`Printable` to get `__str__` and `_repr_html_` through this registry. `fmt_bytes` is the
one byte format every result's message and renderer shares.

The command line's own output goes through `ToolStream`s over the streams it was started with
(`tool_streams()`), and user code it runs (`run`'s script) gets those streams back unwrapped
(`user_streams()`): what the script does to `sys.stdout`/`sys.stderr` does not lose the report.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

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


class OutputFailed(OSError):
    """A write to the tool's stdout or stderr failed for a reason other than a closed pipe
    (a full disk: stdout at `/dev/full`); `stream` names the stream."""

    def __init__(self, stream: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.stream = stream


class ToolStream:
    """The tool's own output on `wrapped` (what was `sys.stdout` or `sys.stderr`).

    Characters the stream cannot encode are escaped (`\\xe9` on an ASCII terminal) instead of
    raising; a write that fails raises `BrokenPipeError` (the reader went away: `| head -1`) or
    `OutputFailed` naming the stream, never an anonymous OSError the tool would take for its crash.
    """

    def __init__(self, wrapped: Any, name: str) -> None:
        self.wrapped = wrapped
        self.name = name

    def write(self, text: str) -> int:
        with self._failing():
            self.wrapped.write(encodable(text, self.wrapped))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._failing():
            self.wrapped.flush()

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OutputFailed(self.name, e) from e

    def write_bytes(self, data: bytes) -> None:
        """`data` unchanged, after the text written so far: a program's own bytes, a patch, a PNG."""
        with self._failing():
            write_bytes(self.wrapped, data)

    def isatty(self) -> bool:
        return bool(self.wrapped.isatty())

    def fileno(self) -> int:
        return int(self.wrapped.fileno())

    @property
    def encoding(self) -> str:
        return getattr(self.wrapped, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:  # closed, errors, buffer, ...: the wrapped stream's
        return getattr(self.wrapped, name)


_STREAMS = ("stdout", "stderr")


@contextlib.contextmanager
def tool_streams() -> Iterator[None]:
    """While inside, `sys.stdout` and `sys.stderr` are `ToolStream`s over the current ones; the
    current objects are put back on exit (one that user code closed meanwhile: the stream
    `user_streams` opened again on its file instead)."""
    started = [getattr(sys, name) for name in _STREAMS]
    for name, stream in zip(_STREAMS, started):
        setattr(sys, name, ToolStream(stream, name) if stream is not None else ToolStream(io.StringIO(), name))
    try:
        yield
    finally:
        for name, stream in zip(_STREAMS, started):
            now = getattr(sys, name)
            if stream is None or not getattr(stream, "closed", False) or not isinstance(now, ToolStream):
                setattr(sys, name, stream)
            else:  # closed by user code the tool ran: its file again, not a closed stream Python would lose
                setattr(sys, name, now.wrapped)


@contextlib.contextmanager
def user_streams() -> Iterator[None]:
    """Run user code with `sys.stdout`/`sys.stderr` as python gives them (not the tool's
    wrappers); after it, the tool's streams again over the same files, whatever the code did to
    `sys.stdout`/`sys.stderr` (replaced, set to None, closed: a closed one is opened again on its
    file descriptor, which Python's standard streams leave open)."""
    tool = [getattr(sys, name) for name in _STREAMS]
    started = [s.wrapped if isinstance(s, ToolStream) else s for s in tool]
    fds = [_fileno(s) for s in started]
    for name, stream in zip(_STREAMS, started):
        setattr(sys, name, stream)
    try:
        yield
    finally:
        for name, before, stream, fd in zip(_STREAMS, tool, started, fds):
            usable = _usable(stream, fd)
            setattr(sys, name, before if usable is stream else ToolStream(usable, name))


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return None


def _usable(stream: Any, fd: int | None) -> Any:
    """`stream` if it can still be written, else a new text stream on its file descriptor."""
    if stream is not None and not getattr(stream, "closed", False):
        return stream
    if fd is None:
        return io.StringIO()  # nothing to write to, as python with no stderr: the output is dropped
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return open(fd, "w", encoding=encoding, errors="backslashreplace", closefd=False, buffering=1)


def write_bytes(stream: Any, data: bytes) -> None:
    """Write `data` to the text stream `stream` byte for byte, through its binary buffer after
    flushing its text; a stream without one (a `StringIO`) gets the text, undecodable bytes escaped."""
    if isinstance(stream, ToolStream):
        stream.write_bytes(data)
        return
    stream.flush()
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(data.decode("utf-8", "backslashreplace"))
        return
    buffer.write(data)
    buffer.flush()


def quiet_after_failure(stream: Any) -> None:
    """After a write to `stream` failed (a closed pipe, a full disk): point its file descriptor at
    the null device, so the text still buffered for it is not written (and fails) again at exit."""
    import os

    wrapped = stream.wrapped if isinstance(stream, ToolStream) else stream
    fd = _fileno(wrapped)
    if fd is None:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)

