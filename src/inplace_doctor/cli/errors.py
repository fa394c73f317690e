"""Exit codes of `inplace-doctor`, and the exceptions `main` turns into them.

Exit codes (docs/cli.md, "Exit codes"): 0 no finding of severity error/warning; 1 such findings; 2 usage
error (one line on stderr); 3 the user's model, factory or module itself raised, or called
`sys.exit` (its traceback without the tool's frames, then one line); 4 inplace-doctor itself
crashed (its traceback, then one line with the versions); 130 interrupted (Ctrl-C); 141 the
reader of the output went away (a closed pipe), quietly, as git and coreutils exit (128 + SIGPIPE).
`run` and `fix` pass a script's own non-zero status on instead, as python and a shell report it
(`sys.exit(5)` is 5, an uncaught exception 1, a death by signal N 128 + N: `child_exit`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InplaceDoctorError, ModelError, UsageError
from ..trace.raised.blame import exception_text, internal_error, raised_by_the_tool
from .scripts.tracebacks import print_script_error

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_MODEL_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_PIPE_CLOSED = 141


class CliUsageError(UsageError):
    """Raised for bad command-line input; becomes one line on stderr and exit 2."""


class FactoryError(InplaceDoctorError):
    """The user's model factory (or the module it is in) raised (chained as `__cause__`): its
    traceback, one line, exit 3."""


def child_exit(returncode: int) -> int:
    """A child process's status as a shell reports it: a death by signal N is 128 + N (143 for
    SIGTERM), not the negative number `subprocess` gives, which exit statuses would wrap (241)."""
    return 128 - returncode if returncode < 0 else returncode


def ended_by(returncode: int) -> str:
    """How a child process ended, in words: `exited 5`, `was killed by SIGTERM (exit 143, as a shell
    reports it)`."""
    if returncode >= 0:
        return f"exited {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (exit {child_exit(returncode)}, as a shell reports it)"


def first_line(exc: BaseException) -> str:
    """The first line of `exc`'s message ("" when it has none, or when its `__str__` raises)."""
    text = exception_text(exc)
    return text.splitlines()[0] if text else ""


def exited(exc: SystemExit) -> str:
    """What a `SystemExit` raised by the user's code did, in the words that call it:
    `sys.exit(0)`, `sys.exit(2) from argparse, which parsed sys.argv`."""
    code = exc.code
    tb = exc.__traceback__
    argparse = False
    while tb is not None:
        argparse = argparse or tb.tb_frame.f_globals.get("__name__") == "argparse"
        tb = tb.tb_next
    called = f"sys.exit({code!r})" if code is not None else "sys.exit()"
    return f"{called} from argparse, which parsed sys.argv" if argparse else called


@contextlib.contextmanager
def model_raises(model: Any, where: Callable[[], str]) -> Iterator[None]:
    """Run the user's model: an exception it raises (not the tool's own errors) becomes a
    `ModelError` chained to it, which `main` shows as audit does: its traceback, then one line
    naming the exception and how far the tool got (`where()`, e.g. "during verify (...)"), exit 3.
    A model that calls `sys.exit` gets the same: it ended the run, which checked nothing."""
    try:
        yield
    except InplaceDoctorError:
        raise
    except SystemExit as e:
        raise ModelError(
            f"{type(model).__name__} called {exited(e)} {where()}: the run ended before the check did, so "
            "nothing is reported clean; return or raise instead of exiting"
        ) from e
    except Exception as e:
        if raised_by_the_tool(e):
            raise internal_error(e) from e
        first = first_line(e)
        raise ModelError(f"{type(model).__name__} raised {type(e).__name__} {where()}" + (f": {first}" if first else "")) from e


def report_user_error(error: BaseException) -> int:
    """Print the user's exception behind `error` (its `__cause__`) as python would, without the
    tool's frames, then `error`'s one line; return exit 3."""
    cause = error.__cause__
    if cause is not None:
        print_script_error(cause, sys.stderr)
    print(f"inplace-doctor: {error}", file=sys.stderr)
    return EXIT_MODEL_ERROR
