"""JSON output: `Report.to_dict()`, findings in stable order, as RFC 8259 JSON; each fix
with its sentence (`message`), made from its record.

JSON has no NaN or infinity (Python's `json` writes `NaN`/`Infinity`, which `JSON.parse` and
strict parsers reject), so a non-finite float is written as the string `"NaN"`, `"Infinity"` or
`"-Infinity"` (the names JavaScript's `Number()` reads back); `dump` is the one place every JSON
the tool prints goes through.
"""

from __future__ import annotations

import json
import math
from typing import Any, TextIO

from ..report import Report
from .fix_text import sentence

NON_FINITE = ("NaN", "Infinity", "-Infinity")


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (in dicts, lists and tuples) replaced by its name."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dump(value: Any, stream: TextIO, **options: Any) -> None:
    """`json.dump` of `value` made RFC 8259 JSON by `json_safe` (`allow_nan=False`: a float that
    slipped past is the tool's bug, raised here rather than written)."""
    json.dump(json_safe(value), stream, allow_nan=False, **options)


def render(report: Report, stream: TextIO) -> None:
    dump(to_json(report), stream, indent=2, sort_keys=False)
    stream.write("\n")


def to_json(report: Report) -> dict[str, Any]:
    """The report as data; each `fixes[]` entry also says itself in words (`message`), made from the record."""
    data = report.to_dict()
    for finding, out in zip(report.findings, data["findings"]):
        for fix, entry in zip(finding.fixes, out["fixes"]):
            text = sentence(fix, finding, report.root_label)
            if not text and not fix.edits and len(finding.fixes) == 1:
                text = finding.fix  # a change no edit expresses: the finding's own fix, as the text prints it
            if text:
                entry["message"] = text
    return data
