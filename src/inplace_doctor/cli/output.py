"""Where results go: a report to `--output FILE`, a file a command writes, a result as text or JSON."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Callable, Iterator, TextIO

from .errors import CliUsageError


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """An OSError while writing `path` becomes the usage error `cannot write 'PATH': why`."""
    try:
        yield
    except OSError as e:
        raise CliUsageError(f"cannot write {path!r}: {e.strerror}") from None


def write_report(path: str, renderer: Callable[[Any, TextIO], None], report: Any) -> None:
    """`--output FILE`: the rendered report in FILE."""
    with writing(path), open(path, "w", encoding="utf-8") as stream:
        renderer(report, stream)


def print_result(ns: argparse.Namespace, result: Any) -> None:
    """A memory report or a plan on stdout: its text, or its `to_dict()` as JSON."""
    if ns.format == "json":
        import json

        json.dump(result.to_dict(), sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        print(result, end="")
