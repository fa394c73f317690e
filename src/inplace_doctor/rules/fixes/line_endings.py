"""The line endings of a source file's bytes, which an `Edit`'s texts carry (findings.py `Edit`).

The fix builders work on the text `linecache` gives (`source.py`), whose lines all
end in "\\n". The edit they make must read and write what the file holds: a CRLF
file's `old` reads "\\r\\n" where it spans lines, and a line its `new` inserts ends
in "\\r\\n", so splicing the edit into the decoded file gives exactly the bytes
`inplace-doctor fix` writes (cli/proof/source_edits.py, which writes the ending of the
line the edit starts on for each line break of `new`, as here).
"""

from __future__ import annotations

import functools
import io
import tokenize


@functools.lru_cache(maxsize=64)
def file_endings(path: str, lines: tuple[str, ...]) -> tuple[str, ...]:
    """Each line's ending in the bytes of the file at `path` ("\\r\\n", "\\r" or "\\n"; "" for a last
    line without one), lines ended as Python ends them; () when those bytes are not the text of
    `lines` (not on disk, changed since linecache read it, not decodable)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)  # utf-8-sig drops the BOM, as linecache's reading does
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return ()
    read = io.StringIO(text, newline="").readlines()  # split at \n, \r\n and a lone \r, endings kept
    if [line.rstrip("\r\n") for line in read] != [line.rstrip("\r\n") for line in lines]:
        return ()
    return tuple(line[len(line.rstrip("\r\n")) :] for line in read)


def in_file_endings(endings: tuple[str, ...], line: int, old: str, new: str) -> tuple[str, str]:
    """`old` and `new` (lines ended in "\\n") of an edit starting on `line`, their lines ended as
    `endings` (`file_endings`) says: `old` each line as the file ends it there, each line break of
    `new` the ending of `line` (on a last line without one, of the line before it; "\\n" in a
    file of one line). As they are when `endings` is ()."""
    if not endings:
        return old, new

    def ending(n: int) -> str:
        return endings[n - 1] if 1 <= n <= len(endings) else ""

    pieces = old.split("\n")
    old = pieces[0] + "".join((ending(line + k) or "\n") + piece for k, piece in enumerate(pieces[1:]))
    return old, new.replace("\n", ending(line) or ending(line - 1) or "\n")
