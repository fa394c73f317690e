"""The `inplace-doctor` command line: the parser, assembled from one module per subcommand, and dispatch.

Exit codes: see `errors.py` (0 clean, 1 findings, 2 usage, 3 the model raised, 4 the tool
crashed, 130 interrupted, 141 the reader of the output went away).

The tool writes through `printing.tool_streams()`: characters the terminal cannot encode are
escaped, a closed pipe (`inplace-doctor rules | head -1`) ends it quietly with 141, as git and
coreutils end (128 + SIGPIPE), and a stream that cannot be written (stdout at `/dev/full`) is one
line and exit 2, as `--output` to a full disk is.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from ..printing import OutputFailed, quiet_after_failure, tool_streams
from ..trace.raised.blame import recursion_headroom
from . import audit, fix, myths, rules, verify
from .args import Parser
from .errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    CliUsageError,
    FactoryError,
    exited,
    report_user_error,
)
from .measure import memory, optimize
from .model import build_model, cwd_importable
from .scripts import run_command
from .scripts.run_command import split_run

# `CliUsageError` and `build_model` are imported from here by tests and users' scripts.
__all__ = ["CliUsageError", "build_model", "main", "run"]


# The commands that run the user's model or script (`rules`, `rule` and `myths` read no environment).
_RUNS_A_PROGRAM = frozenset({"audit", "verify", "memory", "optimize", "run", "fix"})


def _parser() -> Parser:
    parser = Parser(prog="inplace-doctor", description="Find in-place operations that break PyTorch autograd.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in (audit, verify, memory, optimize, run_command, fix, myths):  # the order --help lists them in
        command.add_parser(sub)
    rules.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    status: int | None = None
    with tool_streams():
        try:
            status = _main(argv)
            sys.stdout.flush()  # a write that fails fails here, not in Python's flush at exit
            sys.stderr.flush()
            return status
        except BrokenPipeError:  # the reader went away (`| head -1`): nothing more to say to anyone
            quiet_after_failure(sys.stdout)
            quiet_after_failure(sys.stderr)
            return status or EXIT_PIPE_CLOSED  # `run`: a script's own failure (its closed pipe too) wins
        except OutputFailed as e:
            quiet_after_failure(getattr(sys, e.stream))
            with contextlib.suppress(OSError):
                print(f"inplace-doctor: error: cannot write to {e.stream}: {e.strerror}", file=sys.stderr)
                sys.stderr.flush()
            return EXIT_USAGE


def _main(argv: Sequence[str] | None) -> int:
    from ..errors import InternalError, ModelError, UsageError
    from ..trace.raised.blame import internal_error

    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        script_args: list[str] | None = None
        if argv[:1] in (["run"], ["fix"]):  # the script's (or -m module's) arguments are its own
            argv, script_args = split_run(argv)
        ns = _parser().parse_args(argv)
        if script_args is not None:
            ns.target = ns.target + script_args
        if ns.command in _RUNS_A_PROGRAM:  # a bad INPLACE_DOCTOR_TRACER is one line in each, before any work
            from ..engines.tracer_mode import asked

            asked(None)
        try:  # the current directory stays importable while a model spec's code runs, as under `python -c`
            with cwd_importable() if hasattr(ns, "spec") else contextlib.nullcontext(), recursion_headroom():
                return ns.handler(ns)
        except SystemExit as e:  # the user's code exited (the parser's --help exits before the handler)
            raise ModelError(f"the model called {exited(e)} before the check finished: nothing is reported "
                             "clean; return or raise instead of exiting") from e
    except (CliUsageError, UsageError) as e:
        print(f"inplace-doctor: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (ModelError, FactoryError) as e:
        return report_user_error(e)
    except (BrokenPipeError, OutputFailed):
        raise  # the tool's own output failed: `main` says so
    except KeyboardInterrupt:
        print("inplace-doctor: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # the tool's own crash: its traceback, then what to report
        crash = e.__cause__ if isinstance(e, InternalError) and e.__cause__ is not None else e
        traceback.print_exception(crash, file=sys.stderr)
        print(e if isinstance(e, InternalError) else internal_error(e), file=sys.stderr)
        return EXIT_INTERNAL


def run() -> NoReturn:
    sys.exit(main())
