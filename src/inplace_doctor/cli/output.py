"""Where results go: the files a command writes (`--output`, `--html`, `--png`, `--write`), each
checked before any work and written atomically after it; a result on stdout as text or JSON.

What holds for every file the user names (docs/cli.md, "Files are never replaced behind your back"):

- the path is made absolute before any of the user's code runs, so a script or factory that
  changes directory does not move the report;
- an existing regular file is replaced without `--force` only when it is empty or an earlier
  report of the tool's, recognised by its structure (`provenance.py`); a config `--write`
  produces is never replaced without `--force`; a symbolic link is written through only with
  `--force` (the link stays, its target gets the report);
- a pipe or a character device (`/dev/stdout`, `/dev/null`, a FIFO) is written to as a stream,
  never read and never replaced; a block device or a socket is refused;
- `-` is standard output, as in every Unix tool (never a file named `-`: `./-` names that): the
  bytes go there alone, and what the command would print on stdout goes to stderr instead
  (`screen`); two options may not both name it;
- the folder must exist and be writable, and two options may not name the same file;
- the write goes to a temporary file in the same folder, then is renamed over the path, after a
  second look: a file that appeared or changed since the check (the script wrote it) is kept,
  and the command ends with exit 2 instead.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..printing import write_bytes
from .errors import CliUsageError
from .provenance import READ_LIMIT, is_report, read_regular

NEW, REPLACE, STREAM, STDOUT = "new", "replace", "stream", "stdout"
CONFIG_LIMIT = 1 << 20  # the text of a config `--write --force` replaces, kept to show the diff
_OWN_DESCRIPTOR = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")


@dataclass(frozen=True)
class Destination:
    """One file a command will write, as checked before the work started."""

    option: str  # "--output"
    given: str  # as the user typed it: what messages name
    path: str  # where the bytes go: absolute, fixed before the user's code ran
    kind: str  # NEW, REPLACE (an existing regular file), STREAM (a pipe or a device) or STDOUT (`-`)
    seen: tuple[Any, ...] | None = None  # REPLACE: the file's identity and digest when checked
    previous: bytes | None = None  # REPLACE of a config: its text, for the diff of what --force replaced


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """An OSError while writing `path` becomes the usage error `cannot write 'PATH': why`."""
    try:
        yield
    except OSError as e:
        raise CliUsageError(f"cannot write {path!r}: {e.strerror or e}") from None


def check_outputs(named: dict[str, str | None], *, force: bool = False, config: str | None = None) -> dict[str, Destination]:
    """Before any work starts: each named output (option -> path as given; None when not given)
    checked as the module docstring says; the usage error `cannot write 'PATH': why` else.

    `config` names the option whose file people edit by hand (`--write`): no existing file
    there is replaced without `force`. Returns option -> `Destination` for the given ones."""
    given = {option: path for option, path in named.items() if path is not None}
    for option, path in given.items():
        if not path.strip():
            raise CliUsageError(f"{option} needs a file name, got {path!r}")
    out = {option: _check(option, path, force=force, config=option == config) for option, path in given.items()}
    _refuse_the_same_file_twice(list(out.values()))
    return out


def screen(outputs: dict[str, Destination]) -> Any:
    """Where the command prints what it shows (its report, a plan): stdout, or stderr when a file
    option named `-`, so that stdout carries that file alone (`--html - > page.html`)."""
    return sys.stderr if any(d.kind == STDOUT for d in outputs.values()) else sys.stdout


def _check(option: str, given: str, *, force: bool, config: bool) -> Destination:
    if given == "-":
        return Destination(option, given, given, STDOUT)
    path = os.path.join(os.getcwd(), given)
    if _OWN_DESCRIPTOR.fullmatch(os.path.normpath(path)):
        if not os.path.exists(path):
            raise CliUsageError(f"cannot write {given!r}: no such file descriptor is open; name a file")
        return Destination(option, given, path, STREAM)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return _new_file(option, given, path, force=force)
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            return _new_file(option, given, path, force=force)  # says which part is not a folder
        raise CliUsageError(f"cannot write {given!r}: {e.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise CliUsageError(f"cannot write {given!r}: it is a folder; name a file in it, e.g. {os.path.join(given, 'report')!r}")
    if stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode):
        return Destination(option, given, path, STREAM)  # written as a stream: nothing in it to lose
    if not stat.S_ISREG(info.st_mode):
        what = "a block device (a disk)" if stat.S_ISBLK(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file"
        raise CliUsageError(f"cannot write {given!r}: it is {what}; name a regular file")
    path = _through_link(given, path, force=force)
    data = read_regular(path, READ_LIMIT)
    if not force:
        _refuse_to_replace(given, path, data, info.st_size, config=config)
    _check_folder(given, path)
    previous = data if config and data is not None and len(data) <= CONFIG_LIMIT else None
    return Destination(option, given, path, REPLACE, seen=_identity(path), previous=previous)


def _through_link(given: str, path: str, *, force: bool) -> str:
    """`path`, or where it is a symbolic link the file it names: written through only with --force."""
    if not os.path.islink(path):
        return path
    target = os.path.realpath(path)
    if not force:
        raise CliUsageError(
            f"cannot write {given!r}: it is a symbolic link to {target!r}, which would be replaced; pass "
            "--force to write through the link (the link stays), or name another file"
        )
    return target


def _refuse_to_replace(given: str, path: str, data: bytes | None, size: int, *, config: bool) -> None:
    """Without --force, an existing file is replaced only when it is a writable report of the tool's:
    never a config file (hand edits in it), a file of the user's, nor a read-only file.
    `data`: its bytes (`read_regular`), None when it could not be read as a report; `size`: its size."""
    if config:
        raise CliUsageError(
            f"{given!r} exists and would be replaced (hand edits in it lost); pass --force to replace it "
            "(the changes are shown), or --write a new file and compare"
        )
    if data is None or (data and not is_report(data)):
        too_big = f" ({size} bytes, more than a report this tool checks)" if size > READ_LIMIT else ""
        raise CliUsageError(
            f"cannot write {given!r}: it exists and is not a report of inplace-doctor's{too_big}; pass "
            "--force to replace it, or name another file"
        )
    if not os.access(path, os.W_OK):
        raise CliUsageError(f"cannot write {given!r}: it is read-only; pass --force to replace it, or name another file")


def _new_file(option: str, given: str, path: str, *, force: bool) -> Destination:
    if os.path.islink(path):  # a link to nothing
        target = os.path.realpath(path)
        if not force:
            raise CliUsageError(
                f"cannot write {given!r}: it is a symbolic link to {target!r}, which does not exist; pass "
                "--force to create the file the link names, or name another file"
            )
        path = target
    _check_folder(given, path)
    return Destination(option, given, path, NEW)


def _check_folder(given: str, path: str) -> None:
    folder, shown = os.path.dirname(path), os.path.dirname(given) or "."
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise CliUsageError(f"cannot write {given!r}: {shown!r} is a file, not a folder; name a file in an existing folder")
        raise CliUsageError(f"cannot write {given!r}: the folder {shown!r} does not exist; create it or name a file in an existing folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliUsageError(
            f"cannot write {given!r}: the folder {shown!r} is not writable (permission denied, or a read-only file "
            "system); name a file in a folder you can write to"
        )


def _refuse_the_same_file_twice(destinations: list[Destination]) -> None:
    seen: dict[str, Destination] = {}
    out = [d for d in destinations if d.kind == STDOUT]
    if len(out) > 1:
        raise CliUsageError(
            f"{out[0].option} - and {out[1].option} - both name standard output, where the second would follow "
            "the first in one stream; give one of them a file"
        )
    for d in destinations:
        if d.kind in (STREAM, STDOUT):
            continue  # two streams to one terminal or pipe lose nothing
        key = os.path.realpath(d.path)
        if key in seen:
            first = seen[key]
            raise CliUsageError(
                f"{first.option} {first.given!r} and {d.option} {d.given!r} name the same file, so the second "
                "would replace the first; give each its own file"
            )
        seen[key] = d


def _identity(path: str) -> tuple[Any, ...] | None:
    """What changes when anything writes the file: its inode, size, times, mode, and a digest of
    its bytes (times alone can miss a same-size rewrite within the clock's tick)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    data = read_regular(path, READ_LIMIT) or b""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode,
            hashlib.sha256(data).hexdigest())


def write_output(dest: Destination, data: bytes) -> None:
    """Write `data` to `dest` as `check_outputs` promised, or the usage error saying why not."""
    if dest.kind == STDOUT:  # the tool's stdout: a closed pipe ends it quietly, a full disk is one line (main)
        write_bytes(sys.stdout, data)
        return
    with writing(dest.given):
        if dest.kind == STREAM:
            _write_stream(dest, data)
            return
        now = _identity(dest.path)
        if dest.kind == REPLACE and now is not None and now != dest.seen:
            _changed(dest, "was changed")
        if dest.kind == NEW and now is not None:
            _changed(dest, "was created")
        _write_atomically(dest, data, replace=now is not None)


def _changed(dest: Destination, how: str) -> None:
    raise CliUsageError(
        f"cannot write {dest.given!r}: it {how} while the command ran (by your script or model), after "
        f"inplace-doctor checked it; it is kept as it is and nothing was written: name another file with {dest.option}"
    )


def _write_stream(dest: Destination, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    if _OWN_DESCRIPTOR.fullmatch(os.path.normpath(dest.path)):
        flags |= os.O_APPEND  # the shell's `> file` or `>> file`: after what is there, never over it
    try:
        fd = os.open(dest.path, flags)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO nobody has open for reading: opening it would block
            raise CliUsageError(
                f"cannot write {dest.given!r}: it is a named pipe (FIFO) and nothing is reading it; start its "
                f"reader first (e.g. `cat {dest.given} &`), or name a regular file"
            ) from None
        raise
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _write_atomically(dest: Destination, data: bytes, *, replace: bool) -> None:
    """A temporary file in the same folder, then a rename: a reader sees the old file or the
    whole new one, and a failed write leaves the old one as it was."""
    folder, name = os.path.split(dest.path)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.inplace-doctor.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for any new file
    try:
        try:
            if replace:
                old = os.stat(dest.path)
                os.fchmod(fd, stat.S_IMODE(old.st_mode))
                with contextlib.suppress(OSError):  # keep the owner where allowed (root replacing a user's report)
                    os.fchown(fd, old.st_uid, old.st_gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(temporary, dest.path)
        else:
            _link_new(dest, temporary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _link_new(dest: Destination, temporary: str) -> None:
    """Put the new file in place only if nothing is there yet: a hard link fails on an existing
    name, where a rename would replace it. A file system without hard links gets the rename."""
    try:
        os.link(temporary, dest.path)
    except FileExistsError:
        _changed(dest, "was created")
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV):
            raise
        if os.path.lexists(dest.path):
            _changed(dest, "was created")
        os.replace(temporary, dest.path)


def write_text(dest: Destination, text: str, errors: str = "surrogateescape") -> None:
    write_output(dest, text.encode("utf-8", errors))


def write_report(dest: Destination, renderer: Any, report: Any) -> None:
    """`--output FILE`: the rendered report in FILE."""
    import io

    stream = io.StringIO()
    renderer(report, stream)
    write_text(dest, stream.getvalue())


def print_result(ns: argparse.Namespace, result: Any, stream: Any = None) -> None:
    """A memory report or a plan on `stream` (stdout): its text, or its `to_dict()` as JSON."""
    stream = stream or sys.stdout
    if ns.format == "json":
        from ..render.json import dump

        dump(result.to_dict(), stream, indent=2, sort_keys=False)
        stream.write("\n")
    else:
        print(result, end="", file=stream)
