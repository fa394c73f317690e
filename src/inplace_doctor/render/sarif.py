"""SARIF 2.1.0 output, as GitHub code scanning reads it.

One run: `tool.driver` lists every registered rule (its documentation is the
help text), and each finding is one result located at the line that wrote in
place. The saving and reading sites become related locations. Paths inside
the current repository are relative to `%SRCROOT%`; others are absolute
`file:` URIs. No timestamps: the same report renders to the same bytes.

A result carries `fixes[]` (`artifactChanges` with `replacements`: GitHub code scanning
does not read them today, SARIF viewers that apply fixes do) only for fixes that are `proven`:
checked on the user's program (`inplace-doctor run --prove`, `fix`) and found to compute what
was intended. An unproven edit is never offered for one-click acceptance; its
words stay in the message. Columns count Unicode code points
(`columnKind: unicodeCodePoints`), and inserted texts end their lines as the file does
(CRLF in a CRLF file), as the edits do: applied, they give the bytes `fix` writes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from ..causes import SiteRole
from ..findings import Edit, Finding, Fix, Severity
from ..report import Report
from ..rules import RULES, Rule
from ..sites import Frame, Site, module_ref
from .fix_text import is_offered, sentence
from .json import dump

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
TOOL_NAME = "inplace-doctor"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "inplaceDoctor/v1"

_LEVELS = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}

JSONDict = dict[str, Any]


def render(report: Report, stream: TextIO) -> None:
    """Write `report` as a SARIF 2.1.0 log."""
    dump(to_sarif(report), stream, indent=2, ensure_ascii=False)
    stream.write("\n")


def to_sarif(report: Report) -> JSONDict:
    """The SARIF log of `report`, as plain JSON-ready data."""
    rules = sorted(RULES.values(), key=lambda r: r.code)
    index = {r.code: i for i, r in enumerate(rules)}
    root = repository_root()
    run: JSONDict = {
        "tool": {"driver": _driver(rules)},
        "originalUriBaseIds": {SRCROOT: {"uri": _directory_uri(root)}},
        "columnKind": "unicodeCodePoints",
        "results": [_result(f, index, root, report.root_label) for f in report.findings],
        "properties": {
            "command": report.command,
            "target": report.target,
            "mode": report.mode,
            "backward": report.backward,
        },
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


# -- the tool and its rules ---------------------------------------------------


def _driver(rules: list[Rule]) -> JSONDict:
    # Imported late: this module loads while the package itself is still importing.
    from .._version import __version__

    return {
        "name": TOOL_NAME,
        "version": __version__,
        "semanticVersion": __version__,
        "rules": [_rule_descriptor(r) for r in rules],
    }


def _rule_descriptor(rule: Rule) -> JSONDict:
    """A `reportingDescriptor`: the rule's title, summary and full documentation."""
    doc = rule.doc or rule.summary
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.title},
        "fullDescription": {"text": rule.summary},
        "help": {"text": doc, "markdown": doc_to_markdown(doc)},
        "defaultConfiguration": {"level": _LEVELS[rule.severity]},
        "properties": {"tags": ["pytorch", "correctness"]},
    }


# Over a rule's docstring (RST literals to Markdown), not over a finding's or a note's text.
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def doc_to_markdown(doc: str) -> str:
    """A rule docstring (reStructuredText-ish) as Markdown: ``code`` and `::` blocks become fenced code."""
    parts: list[str] = []
    for prose, code in _split_literal_blocks(doc):
        if prose:
            parts.append(_LITERAL.sub(r"`\1`", prose))
        if code:
            parts.append(f"```python\n{code}\n```")
    return "\n\n".join(parts) + "\n"


def _split_literal_blocks(doc: str) -> list[tuple[str, str]]:
    """(prose, code) pairs: prose up to a line ending in `::`, then the indented block after it."""
    pairs: list[tuple[list[str], list[str]]] = []
    prose: list[str] = []
    code: list[str] = []
    in_block = False
    for line in doc.splitlines():
        if in_block and (not line.strip() or line.startswith((" ", "\t"))):
            code.append(line)
            continue
        if in_block:
            pairs.append((prose, code))
            prose, code, in_block = [], [], False
        if line.rstrip().endswith("::"):
            prose.append(line.rstrip()[:-1])  # `Example::` reads `Example:`
            in_block = True
        else:
            prose.append(line)
    pairs.append((prose, code))
    return [("\n".join(p).strip(), textwrap.dedent("\n".join(c)).strip("\n")) for p, c in pairs]


# -- results ------------------------------------------------------------------


def _result(finding: Finding, index: dict[str, int], root: str, root_label: str) -> JSONDict:
    """One result: the finding's message at the mutation site, the other sites related."""
    result: JSONDict = {"ruleId": finding.code, "level": _LEVELS[finding.severity]}
    if finding.code in index:
        result["ruleIndex"] = index[finding.code]
    result["message"] = {"text": finding.message}
    primary = _primary_location(finding, root, root_label)
    if primary is not None:
        result["locations"] = [primary]
    related = _related(finding, root, root_label)
    if related:
        result["relatedLocations"] = related
    fixes = [_fix(fix, finding, root, root_label) for fix in finding.fixes if is_offered(fix)]
    if fixes:
        result["fixes"] = fixes
    result["partialFingerprints"] = {FINGERPRINT_KEY: fingerprint(finding, primary)}
    result["properties"] = {"confirmed": finding.confirmed, "count": finding.count, "op": finding.mutation.op}
    return result


def _fix(fix: Fix, finding: Finding, root: str, root_label: str) -> JSONDict:
    """A SARIF `fix`: its description, and per file the replacements its edits make."""
    by_file: dict[str, list[Edit]] = {}
    for edit in fix.edits:
        by_file.setdefault(edit.path, []).append(edit)
    return {
        "description": {"text": sentence(fix, finding, root_label) or str(fix.kind)},
        "artifactChanges": [
            {"artifactLocation": artifact_location(path, root), "replacements": [_replacement(e) for e in edits]}
            for path, edits in by_file.items()
        ],
    }


def _replacement(edit: Edit) -> JSONDict:
    """SARIF lines and columns are 1-based, the end column exclusive: an insertion is an empty region."""
    region = {
        "startLine": edit.start.line, "startColumn": edit.start.column + 1,
        "endLine": edit.end.line, "endColumn": edit.end.column + 1,
    }
    return {"deletedRegion": region, "insertedContent": {"text": edit.new}}


def _origin_site(finding: Finding) -> Site | None:
    """For a flag fix, the line that constructed the module with inplace=True, as a site."""
    m = finding.mutation
    if not (m.module_inplace and m.origin is not None):
        return None
    return Site(op=m.op, module=m.module, module_call=m.module_call, module_type=m.module_type,
                file=m.origin.file, line=m.origin.line, stack=(m.origin,))


def _primary_location(finding: Finding, root: str, root_label: str) -> JSONDict | None:
    """Where the fix goes: the line that constructed an `inplace=True` module, else the mutation
    site; when the write has no user frame (one seen only during backward), the saving or reading
    site, since code scanning needs a location."""
    for site in (_origin_site(finding), finding.mutation, finding.saved, finding.read):
        location = _location(site, root, root_label) if site is not None else None
        if location is not None:
            return location
    return None


def _related(finding: Finding, root: str, root_label: str) -> list[JSONDict]:
    """The saving site ("saved for backward here") and the reading site ("read here"), when known."""
    related: list[JSONDict] = []
    overwrote = finding.mutation if _origin_site(finding) is not None else None
    read_text = "views made here" if finding.read_role is SiteRole.VIEWS_MADE else "read here"
    for site, text in ((overwrote, "overwrote here"), (finding.saved, "saved for backward here"), (finding.read, read_text)):
        if site is None:
            continue
        location = _location(site, root, root_label)
        if location is None:
            continue
        related.append({"id": len(related) + 1, **location, "message": {"text": text}})
    return related


def fingerprint(finding: Finding, location: JSONDict | None) -> str:
    """A stable hash of rule code, repository-relative path, line and saved slot."""
    uri, line = "", 0
    if location is not None:
        physical = location["physicalLocation"]
        uri = physical["artifactLocation"]["uri"]
        line = physical["region"]["startLine"]
    slot = finding.slot or ""
    key = "\0".join((finding.code, uri, str(line), str(slot)))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


# -- locations ----------------------------------------------------------------


def _location(site: Site, root: str, root_label: str) -> JSONDict | None:
    """A SARIF `location` for `site`, at its innermost frame inside the repository."""
    frame = pick_frame(site, root)
    if frame is None:
        return None
    location: JSONDict = {
        "physicalLocation": {
            "artifactLocation": artifact_location(frame.file, root),
            "region": {"startLine": max(frame.line, 1)},
        }
    }
    ref = module_ref(site, root_label)
    if ref is not None:
        location["logicalLocations"] = [{"fullyQualifiedName": ref, "kind": "module"}]
    return location


def pick_frame(site: Site, root: str) -> Frame | None:
    """The innermost real-file frame of `site` inside `root`, else its innermost real-file frame."""
    frames = list(site.stack)
    if not frames and site.file is not None and site.line is not None:
        frames = [Frame(site.file, site.line, "")]
    real = [f for f in reversed(frames) if _is_real_file(f.file)]  # innermost first
    inside = next((f for f in real if _relative_to(f.file, root) is not None), None)
    return inside or (real[0] if real else None)


def artifact_location(file: str, root: str) -> JSONDict:
    """`{uri, uriBaseId: %SRCROOT%}` for a file inside `root`, else an absolute `file:` URI."""
    relative = _relative_to(file, root)
    if relative is not None:
        return {"uri": quote(relative), "uriBaseId": SRCROOT}
    return {"uri": Path(os.path.abspath(file)).as_uri()}


def _directory_uri(directory: str) -> str:
    """A `file:` URI for a directory, ending in `/` as SARIF requires of a base URI."""
    uri = Path(directory).as_uri()
    return uri if uri.endswith("/") else uri + "/"


def _is_real_file(file: str) -> bool:
    """False for pseudo-files such as `<string>` or `<stdin>`."""
    return bool(file) and not (file.startswith("<") and file.endswith(">"))


def _relative_to(file: str, root: str) -> str | None:
    """`file` relative to `root`, POSIX-style, or None when it lies outside."""
    for path in (os.path.abspath(file), os.path.realpath(file)):
        if path.startswith(os.path.join(root, "")):
            return Path(os.path.relpath(path, root)).as_posix()
    return None


def repository_root() -> str:
    """The git work tree holding the current directory (`git rev-parse --show-toplevel`), else the cwd."""
    return _repository_root_of(os.getcwd())


@functools.lru_cache(maxsize=16)
def _repository_root_of(cwd: str) -> str:
    """`repository_root` for one working directory: asked of git once per directory, not once per process,
    so a process that changes directory (a test suite, a notebook) never reports paths against a stale root."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        top = ""
    return os.path.realpath(top or cwd)
