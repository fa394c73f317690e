"""Whether an existing file is a report inplace-doctor wrote, told by what only such a report has.

A word is not enough (a `pyproject.toml` that lists the dependency, a script whose docstring
names the tool, an `inplace.toml` all contain "inplace-doctor"), so each format is recognised
by its structure:

- text: the exact first line the text renderer writes (`inplace-doctor audit of SPEC (...)`)
  and its exact last line (`No in-place hazards found.` or `N findings: ...`);
- JSON: an object with the report's `schema_version`, `"tool": "inplace-doctor"`, `command`
  and a `findings` list;
- SARIF: a SARIF 2.1.0 log whose every run's `tool.driver.name` is `inplace-doctor`;
- HTML: the page's exact opening up to its `<meta name="generator" content="inplace-doctor ...">`;
- PNG: the PNG signature and a `tEXt` chunk `Software` = `inplace-doctor` before the image data.

Only a regular file is read (never a pipe or a device, whose reading blocks or never ends), and
at most `READ_LIMIT` bytes of it: a larger file is not taken for a report.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct

READ_LIMIT = 16 << 20  # a report of thousands of findings is a few MiB

GENERATOR = "inplace-doctor"  # the HTML generator tag's content starts with it, the PNG's Software is it
HTML_OPENING = '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="generator" content="inplace-doctor'
_TEXT_FIRST = re.compile(r"inplace-doctor [a-z][a-z-]*( of .+)?")
_TEXT_LAST = re.compile(r"No in-place hazards found\.|\d+ findings?: \d+ (error|warning|info)s?(, \d+ (error|warning|info)s?)*")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_regular(path: str, limit: int) -> bytes | None:
    """The bytes of the regular file at `path` (links followed), or None when it is not a regular
    file, is larger than `limit`, or cannot be read. Never opens a pipe or a device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)  # of what was opened: a file swapped for a FIFO after a stat is still caught
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
        return data if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def is_report(data: bytes) -> bool:
    """Whether `data` is a whole report the tool wrote, in any of its formats."""
    if data.startswith(_PNG_SIGNATURE):
        return _png_is_ours(data)
    try:
        text = data.decode("utf-8", errors="surrogateescape")
    except UnicodeDecodeError:  # pragma: no cover - surrogateescape decodes any bytes
        return False
    if text.startswith(HTML_OPENING):
        return text.rstrip().endswith("</html>")
    if text.startswith("{"):
        return _json_is_ours(text)
    lines = text.rstrip("\n").splitlines()
    return len(lines) >= 2 and bool(_TEXT_FIRST.fullmatch(lines[0])) and bool(_TEXT_LAST.fullmatch(lines[-1]))


def _json_is_ours(text: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    if data.get("tool") == "inplace-doctor":  # the JSON report
        return isinstance(data.get("schema_version"), int) and isinstance(data.get("command"), str) \
            and isinstance(data.get("findings"), list)
    runs = data.get("runs")
    if data.get("version") != "2.1.0" or "sarif" not in str(data.get("$schema", "")) or not isinstance(runs, list) or not runs:
        return False
    try:
        return all(run["tool"]["driver"]["name"] == "inplace-doctor" for run in runs)
    except (KeyError, TypeError):
        return False


def _png_is_ours(data: bytes) -> bool:
    """A `tEXt` chunk `Software\\0inplace-doctor` among the chunks before the first `IDAT`."""
    at = len(_PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IDAT" or len(body) < length:
            return False
        if kind == b"tEXt" and body == b"Software\0" + GENERATOR.encode():
            return True
        at += 12 + length  # length, type, body, CRC
    return False
