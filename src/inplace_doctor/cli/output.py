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


# Reports the tool wrote (text, JSON, SARIF, HTML, PNG metadata) all name it near their start.
_OUR_MARK = b"inplace-doctor"


def _written_by_us(path: str) -> bool:
    """Whether the existing file at `path` is empty or a report inplace-doctor wrote."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return not head or _OUR_MARK in head


def check_writable(*paths: str | None, force: bool = False, config: str | None = None) -> None:
    """Before any work starts: each given path's folder exists and the path is not itself a folder;
    else the usage error `cannot write 'PATH': why` that writing it would end in.

    Nothing the user wrote is replaced without `force`: a report path (`paths`) may replace an
    earlier report of the tool's, never another file (`--output train.py`); `config` (a file
    `--write` produces, which people edit by hand) may replace no existing file at all."""
    for path in [*paths, config]:
        if not path:
            continue
        folder = os.path.dirname(path) or "."
        if os.path.isdir(path):
            raise CliUsageError(f"cannot write {path!r}: it is a folder; name a file in it, e.g. {os.path.join(path, 'report')!r}")
        if not os.path.isdir(folder):
            why = "is not a folder" if os.path.exists(folder) else "does not exist"
            raise CliUsageError(f"cannot write {path!r}: the folder {folder!r} {why}; create it or name a file in an existing folder")
        if force or not os.path.exists(path):
            continue
        if path == config:
            raise CliUsageError(
                f"{path!r} exists and would be replaced (hand edits in it lost); pass --force to replace it "
                "(the changes are shown), or --write a new file and compare"
            )
        if not _written_by_us(path):
            raise CliUsageError(
                f"cannot write {path!r}: it exists and is not a report of inplace-doctor's; pass --force to "
                "replace it, or name another file"
            )


def write_report(path: str, renderer: Callable[[Any, TextIO], None], report: Any) -> None:
    """`--output FILE`: the rendered report in FILE."""
    with writing(path), open(path, "w", encoding="utf-8", errors="surrogateescape") as stream:
        renderer(report, stream)


def print_result(ns: argparse.Namespace, result: Any) -> None:
    """A memory report or a plan on stdout: its text, or its `to_dict()` as JSON."""
    if ns.format == "json":
        from ..render.json import dump

        dump(result.to_dict(), sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        print(result, end="")
