"""Suppressing findings: a comment on the line, a region of code, or a module-path glob.

- `x += y  # inplace-doctor: ignore[IPD105]` drops IPD105 findings whose
  overwriting line is that one; `# inplace-doctor: ignore` drops every code.
  Codes may be prefixes (`IPD1`), comma-separated.
- `with ipd.suppress("IPD105"):` (or `@ipd.suppress("IPD105")` on a function)
  drops those findings while the region runs.
- `per-module-ignores` in `[tool.inplace-doctor]` (see project_config.py)
  drops codes for module paths matching a glob.

A suppressed IPD101 still leaves PyTorch's own error at backward: suppression
silences the report, not autograd.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence

from ..errors import UsageError
from ..findings import Finding
from ..sites import module_path
from .registry import RULES, unknown_rule_message

_COMMENT = re.compile(r"#\s*inplace-doctor:\s*ignore(?:\[([^\]]*)\])?", re.IGNORECASE)
_REGIONS: list[tuple[str, ...]] = []  # active `suppress` regions; () means every code


def _codes(items: Iterable[str]) -> tuple[str, ...]:
    out = []
    for item in items:
        for part in str(item).split(","):
            code = part.strip().upper()
            if not code:
                continue
            if not any(c.startswith(code) for c in RULES):
                raise UsageError(unknown_rule_message(code))
            out.append(code)
    return tuple(out)


def _matches(code: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(code.startswith(p) for p in patterns)


def comment_codes(line: str | None) -> tuple[str, ...] | None:
    """The codes an `# inplace-doctor: ignore[...]` comment on `line` names; () for all; None without one."""
    if not line:
        return None
    m = _COMMENT.search(line)
    if m is None:
        return None
    if m.group(1) is None:
        return ()
    return tuple(p.strip().upper() for p in m.group(1).split(",") if p.strip())


class suppress(contextlib.ContextDecorator):
    """Drop findings of these codes (prefixes allowed; none: every code) raised inside the region.

    Example:
        >>> with ipd.suppress("IPD105"):
        ...     pass
    """

    def __init__(self, *codes: str) -> None:
        self.codes = _codes(codes)

    def __enter__(self) -> suppress:
        _REGIONS.append(self.codes)
        return self

    def __exit__(self, *exc: object) -> None:
        # Remove this region's entry even if regions were exited out of order.
        for i in range(len(_REGIONS) - 1, -1, -1):
            if _REGIONS[i] is self.codes:
                del _REGIONS[i]
                break


def is_suppressed(finding: Finding, per_module: Mapping[str, Sequence[str]] | None = None) -> bool:
    """Whether a comment, an active region or a per-module ignore drops this finding."""
    code = finding.code
    if any(_matches(code, region) for region in _REGIONS):
        return True
    codes = comment_codes(finding.mutation.code)  # the comment on the overwriting line
    if codes is not None and _matches(code, codes):
        return True
    if per_module and finding.mutation.module is not None:
        path = finding.mutation.module
        names = (path, module_path(path))  # as written, or as reports print it
        for pattern, ignored in per_module.items():
            if any(fnmatch.fnmatchcase(n, pattern) for n in names) and _matches(code, ignored):
                return True
    return False
