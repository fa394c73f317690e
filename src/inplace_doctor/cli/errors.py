"""Exit codes of `inplace-doctor`, and the exceptions `main` turns into them.

Exit codes: 0 no finding of severity error/warning; 1 such findings; 2 usage
error (one line on stderr); 3 the user's model or factory itself raised; 4 inplace-doctor
itself crashed (its traceback, then one line with the versions); 130 interrupted (Ctrl-C); 141
the reader of the output went away (a closed pipe), quietly, as git and coreutils exit (128 + SIGPIPE).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InplaceDoctorError, ModelError, UsageError
from ..trace.blame import internal_error, raised_by_the_tool

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_MODEL_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_PIPE_CLOSED = 141


class CliUsageError(UsageError):
    """Raised for bad command-line input; becomes one line on stderr and exit 2."""


class FactoryError(InplaceDoctorError):
    """The user's model factory raised (chained as `__cause__`): its traceback, one line, exit 3."""


@contextlib.contextmanager
def model_raises(model: Any, where: Callable[[], str]) -> Iterator[None]:
    """Run the user's model: an exception it raises (not the tool's own errors) becomes a
    `ModelError` chained to it, which `main` shows as audit does: its traceback, then one line
    naming the exception and how far the tool got (`where()`, e.g. "during verify (...)"), exit 3."""
    try:
        yield
    except InplaceDoctorError:
        raise
    except Exception as e:
        if raised_by_the_tool(e):
            raise internal_error(e) from e
        text = str(e).strip()
        first = text.splitlines()[0] if text else ""
        raise ModelError(f"{type(model).__name__} raised {type(e).__name__} {where()}" + (f": {first}" if first else "")) from e
