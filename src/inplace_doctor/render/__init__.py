"""Output formats. Each module has `render(report, stream)` and reads only a Report."""

from __future__ import annotations

from typing import Callable, TextIO

from ..errors import UsageError
from ..report import Report
from . import json as json_format
from . import sarif as sarif_format
from . import text as text_format

FORMATS: dict[str, Callable[[Report, TextIO], None]] = {
    "text": text_format.render,
    "json": json_format.render,
    "sarif": sarif_format.render,
}


def get_renderer(name: str) -> Callable[[Report, TextIO], None]:
    try:
        return FORMATS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, list(FORMATS), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(FORMATS)}"
        raise UsageError(f"unknown format {name!r}; {hint}") from None
