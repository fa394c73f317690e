"""Output formats, and the text of every result.

`text`, `json` and `sarif` each have `render(report, stream)` and read only a `Report`;
`FORMATS` maps `--format` names to them. `html` is no `--format`: it writes one self-contained
page (findings, the memory timeline, a plan) for `--html FILE` of `audit`, `memory` and `optimize`. `text`, `memory_text`, `plan_text` and `verify_text`
register the plain text (and notebook view) of `Report`, `MemoryReport`, `Plan` and
`VerifyResult` with `printing`, which is how `str(result)` works without results importing
this room. Renderers may import the records, `rules/` (rule documentation for SARIF) and the
engines' result types. `explain/` makes the sentences of every finding from its records,
registered with `explanations.explains` and made when asked (`Finding.message`, a renderer); only
cli/ and the package's `__init__` import render/.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from ..errors import UsageError
from ..report import Report
from . import (  # noqa: F401  (registers str() of the results)
    explain,  # noqa: F401  (registers the sentences of every finding)
    memory_text,
    plan_text,
    verify_text,
)
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
