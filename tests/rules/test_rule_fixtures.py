"""Per-rule fixture programs, as torchfix and ruff keep them: tests/rules/IPDxxx/{flagged,clean}/*.py.

Each fixture is a small self-contained torch program, run in this process under
`ipd.watch()` as `python` would run it (`runpy.run_path(..., run_name="__main__")`).

- flagged/: every line the tool should report carries a trailing comment
  `# expect: IPDxxx` (the finding's primary location: the line that wrote in
  place). Optional `# expect-saved: IPDxxx` marks the line that saved the
  tensor, `# expect-read: IPDxxx` the line that read the overwritten one; when a
  file has such a marker for a code, those lines are checked too. The (code,
  line) pairs the tool reports for the marked codes must equal the marked ones,
  exactly: a missing finding, an extra one, or one at another line fails.
  Fixtures whose bug makes PyTorch raise (backward errors, errors at the op) are
  run as they are; `watch` turns PyTorch's error into `ipd.InplaceError` (a
  RuntimeError), caught here, and keeps its findings.
- clean/: the near-miss correct idiom. It must run without raising and produce
  no finding of its folder's rule.

A rule in `ipd.RULES` needs a folder with both kinds, or an entry in SKIPPED
with the reason (also listed in tests/rules/README.md).
"""

from __future__ import annotations

import contextlib
import json
import re
import runpy
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from conftest import in_fresh_thread, line_of

import inplace_doctor as ipd

HERE = Path(__file__).resolve().parent

# Rules that cannot be triggered on CPU, with the reason. Every rule of the tool is today.
SKIPPED: dict[str, str] = {}

# Clean fixtures on which the tool reports its rule although the code is correct (a tool bug):
# path relative to tests/rules -> reason. They stay xfail(strict=True) until the tool is fixed.
KNOWN_FALSE_POSITIVES: dict[str, str] = {}

_MARKER = re.compile(r"\bexpect(?:-(saved|read))?:\s*(IPD\d{3})\b")
_KINDS = ("flagged", "clean")


def fixtures(kind: str) -> list[Path]:
    return sorted(HERE.glob(f"IPD*/{kind}/*.py"))


def fixture_id(path: Path) -> str:
    return str(path.relative_to(HERE))


def markers(path: Path) -> dict[str, set[tuple[str, int]]]:
    """{'': {(code, line)}, 'saved': ..., 'read': ...} from the trailing `# expect...:` comments."""
    found: dict[str, set[tuple[str, int]]] = {"": set(), "saved": set(), "read": set()}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "#" not in text:
            continue
        for role, code in _MARKER.findall(text.split("#", 1)[1]):
            found[role].add((code, number))
    return found


def _run_watched(path: Path, device: str | None) -> tuple[list[ipd.Finding], BaseException | None]:
    raised: BaseException | None = None
    session = ipd.watch()
    # `with torch.device(...)`: the program's factories and modules make their tensors there, as
    # after `torch.set_default_device` (this thread only).
    with torch.device(device) if device is not None else contextlib.nullcontext():
        try:
            with session:
                runpy.run_path(str(path), run_name="__main__")
        except RuntimeError as e:  # ipd.InplaceError (at the op or in backward) is a RuntimeError
            raised = e
    return list(session.findings), raised


def run_fixture(path: Path, device: str | None = None) -> tuple[list[ipd.Finding], BaseException | None]:
    """Run the fixture as `python path` would, under watch(); its findings and what it raised.

    In a fresh thread (conftest.in_fresh_thread), as `inplace-doctor run` would: no
    frame of pytest's takes part in the caller lines that fold findings. With `device`
    ("cuda"), the fixture's tensors and modules are made on that device.
    """
    return in_fresh_thread(_run_watched, path, device)


def _where(site: ipd.Site | None, path: Path) -> int | str | None:
    """The site's line when it is in the fixture file, else `file:line` (which never matches a marker)."""
    if site is None:
        return None
    frame = site.stack[-1] if site.stack else None
    file, line = (frame.file, frame.line) if frame is not None else (site.file, site.line)
    if file is not None and Path(file).resolve() == path:
        return line
    return f"{file}:{line}"


def _describe(findings: Iterable[ipd.Finding]) -> str:
    return "\n".join(
        f"  {f.code} {f.severity} at {f.mutation.file}:{f.mutation.line}: {f.message.splitlines()[0][:300]}"
        for f in findings
    ) or "  (no findings)"


@pytest.mark.parametrize("path", fixtures("flagged"), ids=fixture_id)
def test_flagged_fixture_reports_the_marked_lines(path: Path) -> None:
    check_flagged(path)


def check_flagged(path: Path, device: str | None = None) -> None:
    """The flagged fixture's findings of its marked codes are exactly at its marked lines (tests/cuda: on CUDA)."""
    marked = markers(path)
    codes = {code for code, _ in marked[""]}
    assert path.parent.parent.name in codes, f"{fixture_id(path)} marks no `# expect: {path.parent.parent.name}` line"

    findings, raised = run_fixture(path, device)
    ours = [f for f in findings if f.code in codes]
    where = f"\nfindings:\n{_describe(findings)}\nraised: {raised!r}"
    # PyTorch's own in-place errors come out of watch() as InplaceError naming the culprits.
    assert raised is None or isinstance(raised, ipd.InplaceError), where
    assert {(f.code, _where(f.mutation, path)) for f in ours} == marked[""], where
    for role, site_of in (("saved", lambda f: f.saved), ("read", lambda f: f.read)):
        checked = {code for code, _ in marked[role]}
        reported = {(f.code, _where(site_of(f), path)) for f in ours if f.code in checked}
        assert reported == marked[role], f"{role} sites differ{where}"
    assert_round_trip(findings)


def assert_round_trip(findings: list[ipd.Finding]) -> None:
    """Records cross a process intact (issue 39): the report's JSON, read back with
    `Report.from_dict`, is the same records, whose words are the same words."""
    report = ipd.Report(findings=findings)
    data = json.loads(json.dumps(report.to_dict()))
    back = ipd.Report.from_dict(data)
    assert back.findings == findings
    assert [f.to_dict() for f in back.findings] == data["findings"]  # every field, stacks and facts included
    assert [f.message for f in back.findings] == [f.message for f in findings]


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FALSE_POSITIVES[fixture_id(p)]))
        if fixture_id(p) in KNOWN_FALSE_POSITIVES
        else p
        for p in fixtures("clean")
    ],
    ids=fixture_id,
)
def test_clean_fixture_reports_nothing_of_its_rule(path: Path) -> None:
    check_clean(path)


def check_clean(path: Path, device: str | None = None) -> None:
    """The clean fixture runs without raising and with no finding of its folder's rule (tests/cuda: on CUDA)."""
    code = path.parent.parent.name
    assert not any(_MARKER.search(t) for t in path.read_text(encoding="utf-8").splitlines()), "markers in a clean file"
    findings, raised = run_fixture(path, device)
    assert raised is None, f"a clean fixture raised: {raised!r}\nfindings:\n{_describe(findings)}"
    assert [f for f in findings if f.code == code] == [], f"{code} reported on correct code:\n{_describe(findings)}"


def test_every_rule_has_flagged_and_clean_fixtures_or_is_skipped() -> None:
    folders = {p.name for p in HERE.glob("IPD*") if p.is_dir()}
    assert folders <= set(ipd.RULES), f"fixture folders for unknown rules: {sorted(folders - set(ipd.RULES))}"
    assert set(SKIPPED) <= set(ipd.RULES), f"SKIPPED names unknown rules: {sorted(set(SKIPPED) - set(ipd.RULES))}"
    readme = (HERE / "README.md").read_text(encoding="utf-8")
    missing = []
    for code in sorted(ipd.RULES):
        if code in SKIPPED:
            assert SKIPPED[code].strip(), f"{code} is skipped without a reason"
            assert code in readme, f"{code} is skipped but tests/rules/README.md does not say so"
            assert code not in folders, f"{code} is skipped but has fixtures: remove it from SKIPPED"
            continue
        for kind in _KINDS:
            if not list((HERE / code / kind).glob("*.py")):
                missing.append(f"{code}/{kind}")
    assert not missing, f"rules without fixtures (add them, or add the rule to SKIPPED with a reason): {missing}"


def test_markers_are_parsed() -> None:
    """The marker grammar itself, so a typo in the regex cannot silently mark nothing."""
    sample = HERE / "IPD101" / "flagged" / "sigmoid_then_mul.py"
    found = markers(sample)
    assert {code for code, _ in found[""]} == {"IPD101"} and len(found[""]) == 1
    assert {code for code, _ in found["saved"]} == {"IPD101"} and found["read"] == set()
    assert found[""] == {("IPD101", line_of(sample, "s.mul_(2)"))}
    assert found["saved"] == {("IPD101", line_of(sample, "s = torch.sigmoid(x)"))}
