"""Where results go: a report to `--output FILE`, a file a command writes, a result as text or JSON."""

from __future__ import annotations

import argparse
import contextlib
import os
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


def check_writable(*paths: str | None) -> None:
    """Before any work starts: each given path's folder exists and the path is not itself a folder;
    else the usage error `cannot write 'PATH': why` that writing it would end in."""
    for path in paths:
        if not path:
            continue
        folder = os.path.dirname(path) or "."
        if os.path.isdir(path):
            raise CliUsageError(f"cannot write {path!r}: it is a folder; name a file in it, e.g. {os.path.join(path, 'report')!r}")
        if not os.path.isdir(folder):
            why = "is not a folder" if os.path.exists(folder) else "does not exist"
            raise CliUsageError(f"cannot write {path!r}: the folder {folder!r} {why}; create it or name a file in an existing folder")


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
