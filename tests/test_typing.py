"""The package type-checks with mypy (STYLE.md: type hints everywhere, checked)."""

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

SRC = Path(__file__).resolve().parents[1] / "src" / "inplace_doctor"


def test_package_type_checks():
    out, err, status = api.run([str(SRC), "--no-error-summary", "--cache-dir", "/tmp/inplace-doctor-mypy-cache"])
    assert status == 0, out + err


# The rooms whose code is the tool's decisions and their records: `mypy --strict` on them (imports
# followed silently: trace/ and engines/ talk to torch's partly untyped API and are checked above).
STRICT = ["causes.py", "sites.py", "events.py", "findings.py", "explanations.py", "verification.py", "report.py", "rules", "render"]


def test_records_rules_and_render_type_check_strictly():
    out, err, status = api.run([
        *(str(SRC / p) for p in STRICT), "--strict", "--follow-imports=silent", "--no-error-summary",
        "--cache-dir", "/tmp/inplace-doctor-mypy-strict-cache",
    ])
    assert status == 0, out + err


def _mentions_any(hint: object) -> bool:
    import typing

    return hint is typing.Any or any(_mentions_any(arg) for arg in typing.get_args(hint))


def test_no_any_in_a_rule_signature_or_a_finding_field():
    """A rule's event and context are typed (the context a `RuleContext` Protocol), and so is every
    field of a finding: no `dict[str, Any]` of details to read back by key."""
    import dataclasses
    import typing

    from inplace_doctor.findings import Finding
    from inplace_doctor.rules import RULES
    from inplace_doctor.rules.registry import RuleContext

    for code, registered in RULES.items():
        hints = typing.get_type_hints(registered.check)
        assert not any(_mentions_any(h) for h in hints.values()), f"{code}: {hints}"
        assert hints["ctx"] is RuleContext, code
    hints = typing.get_type_hints(Finding)
    for field in dataclasses.fields(Finding):
        assert not _mentions_any(hints[field.name]), f"Finding.{field.name}: {hints[field.name]}"
