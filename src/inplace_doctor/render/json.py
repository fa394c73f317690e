"""JSON output: `Report.to_dict()`, findings in stable order."""

from __future__ import annotations

import json
from typing import TextIO

from ..report import Report


def render(report: Report, stream: TextIO) -> None:
    json.dump(report.to_dict(), stream, indent=2, sort_keys=False)
    stream.write("\n")
