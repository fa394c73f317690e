"""Applying `Edit` records to source files byte for byte: what `inplace-doctor fix` writes.

An `Edit` (findings.py) names a range of one file by `Position`s (1-based line,
0-based column in characters of the decoded line) and the text it reads there.
The engine works on bytes: the encoding comes from the file itself (a UTF-8 BOM,
a PEP 263 coding line, else UTF-8: `tokenize.detect_encoding`, as Python reads
it), each position becomes a byte offset within its line, and the new text is
encoded and spliced in. Every byte outside the edited ranges is the file's own:
CRLF or CR line endings, the BOM, a latin-1 byte. A newline inside an edit's new
text takes the ending of the line it lands on (on a last line without one, the
ending of the line before it): the edits the rules build already carry those
endings (findings.py `Edit`), and one written with "\\n" is written the same.

Before anything is written: each edit's range must read its `old` text (else the
file changed since the run), edits of one file must not overlap, and each result
must parse. `write_all` then replaces the files atomically (a temporary file in
the same folder with the original's mode and, where allowed, owner, on disk before
it is renamed over the original), and puts back those already replaced if a later
one fails: edits that span files land all or nothing. A file with a second hard
link is written in place, last, so every name of it sees the edit.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import tempfile
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..._parsing import parse
from ...errors import InplaceDoctorError
from ...findings import Edit, Position


class EditError(InplaceDoctorError):
    """An edit that cannot be made as it stands (the file changed since the run, or the result
    would not parse); `fix` turns it into its one usage line."""


@dataclass(frozen=True)
class Source:
    """A file's bytes and how Python decodes them."""

    data: bytes
    encoding: str  # the codec of the text after any BOM ("utf-8" for "utf-8-sig")
    bom: int  # bytes of BOM at the start

    @classmethod
    def read(cls, path: str) -> Source:
        with open(path, "rb") as f:
            return cls.of(f.read(), path)

    @classmethod
    def of(cls, data: bytes, path: str) -> Source:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError as e:
            raise EditError(f"{path} declares an encoding Python cannot read ({e.msg})") from None
        if encoding == "utf-8-sig":
            return cls(data, "utf-8", 3 if data.startswith(b"\xef\xbb\xbf") else 0)
        return cls(data, encoding, 0)

    def line_starts(self) -> list[int]:
        """The byte offset of each line's start (index 0 is line 1), lines ended as Python ends
        them: by \\n, \\r\\n or a lone \\r (ASCII in every encoding Python accepts for source)."""
        starts = [self.bom]
        data, i, n = self.data, self.bom, len(self.data)
        while i < n:
            byte = data[i]
            if byte == 0x0A or (byte == 0x0D and (i + 1 >= n or data[i + 1] != 0x0A)):
                starts.append(i + 1)
            i += 1
        return starts

    def offset(self, pos: Position, starts: list[int]) -> int:
        """The byte offset of `pos`; EditError when the file has no such place."""
        if not 1 <= pos.line <= len(starts):
            raise EditError(f"line {pos.line} is past the end of the file ({len(starts)} lines)")
        begin = starts[pos.line - 1]
        end = starts[pos.line] if pos.line < len(starts) else len(self.data)
        text = self.data[begin:end].decode(self.encoding, errors="strict")
        if pos.column > len(text.rstrip("\r\n")):
            raise EditError(f"line {pos.line} has no column {pos.column}")
        return begin + len(text[: pos.column].encode(self.encoding))

    def ending_at(self, offset: int) -> bytes:
        """The line ending of the line holding `offset`; for a last line without one, the ending of
        the line before it (a CRLF file keeps CRLF), and \\n in a file of one line."""
        end = self.data.find(b"\n", offset)
        cr = self.data.find(b"\r", offset)
        if cr != -1 and (end == -1 or cr < end):
            return b"\r\n" if self.data[cr + 1 : cr + 2] == b"\n" else b"\r"
        if end != -1:
            return b"\n"
        last = max(self.data.rfind(b"\n", 0, offset), self.data.rfind(b"\r", 0, offset))
        if last == -1:
            return b"\n"
        if self.data[last : last + 1] == b"\r":
            return b"\r"
        return b"\r\n" if self.data[last - 1 : last] == b"\r" else b"\n"


def _plain(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def apply_to_source(path: str, source: Source, edits: Iterable[Edit]) -> bytes:
    """`source`'s bytes with every edit spliced in; EditError (naming `path`) when an edit's range
    does not read its `old` text, two edits overlap, or the result does not parse."""
    starts = source.line_starts()
    spans: list[tuple[int, int, bytes]] = []
    for edit in edits:
        try:
            begin, end = source.offset(edit.start, starts), source.offset(edit.end, starts)
        except EditError as e:
            raise EditError(f"{path} changed since the run: {e}") from None
        found = source.data[begin:end].decode(source.encoding)
        if end < begin or _plain(found) != _plain(edit.old):
            raise EditError(
                f"{path} changed since the run: line {edit.start.line} reads {found.strip()[:60]!r} where the run saw "
                f"{edit.old.strip()[:60]!r}; run fix again"
            )
        new = _plain(edit.new).replace("\n", source.ending_at(begin).decode("ascii"))
        try:
            spans.append((begin, end, new.encode(source.encoding)))
        except UnicodeEncodeError:
            raise EditError(f"the edit of {path}:{edit.start.line} has text its encoding ({source.encoding}) cannot hold") from None
    spans.sort(key=lambda s: (s[0], s[1]))
    for (_, end, _), (begin, _, _) in zip(spans, spans[1:]):
        if begin < end:
            raise EditError(f"two edits of {path} overlap at byte {begin}: fix them one at a time")
    out, at = bytearray(), 0
    for begin, end, new_bytes in spans:
        out += source.data[at:begin] + new_bytes
        at = end
    out += source.data[at:]
    result = bytes(out)
    try:
        parse(result, filename=path)
    except SyntaxError as e:
        raise EditError(f"the edit of {path} would not parse (line {e.lineno}: {e.msg}); nothing was written") from None
    return result


def already_made(edit: Edit, source: Source) -> bool:
    """Whether an insertion's text already stands right before where it would go: the same edit
    proposed again (a clone before a statement that cloning cannot help, found again after it)."""
    new = _plain(edit.new).strip()
    if edit.old or not new:
        return False
    try:
        at = source.offset(edit.start, source.line_starts())
    except EditError:
        return False
    before = _plain(source.data[source.bom : at].decode(source.encoding, "replace")).rstrip()
    return before.endswith(new) and (len(before) == len(new) or before[-len(new) - 1] in " \t\n;")


def plan(edits: Iterable[Edit], root: str, current: Mapping[str, bytes] | None = None) -> dict[str, tuple[bytes, bytes]]:
    """Absolute path -> (bytes now, bytes after) for every file the edits touch, every check made
    before any file is written. Relative paths are read against `root`; `current` gives the bytes
    of files already edited in memory (a later round's edits apply to those)."""
    by_file: dict[str, list[Edit]] = {}
    for edit in edits:
        by_file.setdefault(os.path.realpath(os.path.join(root, edit.path)), []).append(edit)
    out: dict[str, tuple[bytes, bytes]] = {}
    for path, file_edits in by_file.items():
        if current is not None and path in current:
            source = Source.of(current[path], path)
        else:
            try:
                source = Source.read(path)
            except OSError as e:
                raise EditError(f"cannot read {path}: {e.strerror}") from None
        out[path] = (source.data, apply_to_source(os.path.relpath(path, root), source, file_edits))
    return out


def write_all(changes: Mapping[str, tuple[bytes, bytes]]) -> None:
    """Write each file's new bytes, atomically per file, all or nothing across files: a file that
    no longer holds its old bytes, or a failed write, leaves every file as it was (EditError).

    A file with other hard links is written in place instead, after every other file is renamed
    into place: a rename would give this name a new file and leave the other names the old bytes.
    Its new bytes are staged beside it first all the same (the folder can hold them)."""
    staged: list[tuple[str, str]] = []
    try:
        for path, (before, after) in changes.items():
            with open(path, "rb") as f:
                if f.read() != before:
                    raise EditError(f"{path} changed while fix ran; nothing was written: run fix again")
            staged.append((path, _staged(path, after)))
    except OSError as e:
        for _, tmp in staged:
            os.unlink(tmp)
        raise EditError(f"could not write the edits ({e}); nothing was written") from None
    except BaseException:
        for _, tmp in staged:
            os.unlink(tmp)
        raise
    linked = {path for path, _ in staged if os.stat(path).st_nlink > 1}
    staged.sort(key=lambda p: p[0] in linked)  # renamed first; written in place last
    done: list[str] = []
    try:
        for path, tmp in staged:
            if path in linked:
                os.unlink(tmp)
                _write_in_place(path, changes[path][1])
            else:
                os.replace(tmp, path)
            done.append(path)
    except OSError as e:
        failed = e.filename or staged[len(done)][0]
        _put_back(changes, staged, done, linked)
        raise EditError(f"could not write {failed} ({e.strerror}); every file is as it was") from None


def _put_back(changes: Mapping[str, tuple[bytes, bytes]], staged: list[tuple[str, str]], done: list[str],
              linked: set[str]) -> None:
    """After a failed write, every file as it was: those in `done` (the first of `staged`) written
    back the way their edit was (in place where `linked`); the rest's staged files removed and, where
    written in place, their old bytes put back (the failed write may have gone part way)."""
    for path in done:  # put back what was already written, as it was written
        if path in linked:
            _write_in_place(path, changes[path][0])
        else:
            os.replace(_staged(path, changes[path][0]), path)
    for path, tmp in staged[len(done):]:
        if path in linked:  # its own write failed part way, maybe: its old bytes again
            with contextlib.suppress(OSError):
                _write_in_place(path, changes[path][0])
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_in_place(path: str, data: bytes) -> None:
    """`data` written into the file at `path` itself (its inode: every hard link sees it), on disk."""
    with open(path, "r+b") as f:
        f.write(data)
        f.truncate()
        f.flush()
        os.fsync(f.fileno())


def _staged(path: str, data: bytes) -> str:
    """A temporary file beside `path` holding `data`, with `path`'s permissions: what `os.replace`
    puts in its place. Removed again if it cannot be written."""
    fd, tmp = tempfile.mkstemp(prefix=".inplace-doctor-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            old = os.stat(path)
            with contextlib.suppress(OSError):  # the owner kept where allowed (root editing a user's file)
                os.fchown(out.fileno(), old.st_uid, old.st_gid)
            os.fchmod(out.fileno(), old.st_mode & 0o7777)  # after chown, which may clear set-id bits
            os.fsync(out.fileno())  # on disk before the rename makes it the file
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def unified_diff(changes: Mapping[str, tuple[bytes, bytes]], root: str) -> bytes:
    """The patch, in bytes: each line exactly as it will be written (its CRLF, its encoding), lines
    split at \\n only (a CR is a byte of its line, as git and patch read it), a last line without
    an ending marked `\\ No newline at end of file`: what `git apply` and `patch` take."""
    out = []
    for path, (before, after) in changes.items():
        shown = os.fsencode(os.path.relpath(path, root))  # a file name that is not UTF-8 keeps its bytes
        for line in difflib.diff_bytes(difflib.unified_diff, _lines(before), _lines(after), b"a/" + shown, b"b/" + shown):
            out.append(line if line.endswith(b"\n") else line + b"\n\\ No newline at end of file\n")
    return b"".join(out)


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    return [line + b"\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
