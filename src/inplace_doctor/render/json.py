"""JSON output: `Report.to_dict()`, findings in stable order, each fix with its sentence (`message`)."""

from __future__ import annotations

import json
from typing import Any, TextIO

from ..report import Report
from .fix_text import sentence


def render(report: Report, stream: TextIO) -> None:
    json.dump(to_json(report), stream, indent=2, sort_keys=False)
    stream.write("\n")


def to_json(report: Report) -> dict[str, Any]:
    """The report as data; each `fixes[]` entry also says itself in words (`message`), made from the record."""
    data = report.to_dict()
    for finding, out in zip(report.findings, data["findings"]):
        for fix, entry in zip(finding.fixes, out["fixes"]):
            text = sentence(fix, finding, report.root_label)
            if text:
                entry["message"] = text
    return data
