"""The package type-checks with mypy (STYLE.md: type hints everywhere, checked)."""

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "inplace_doctor"

# The rooms whose code is the tool's decisions and their records: `--strict`'s flags on them, set in
# pyproject.toml for these modules only (trace/ and engines/ talk to torch's partly untyped API and are
# checked with the defaults).
STRICT = ["causes.py", "sites.py", "events.py", "findings.py", "explanations.py", "verification.py", "report.py", "rules", "render"]


@pytest.fixture(scope="module")
def mypy_output() -> tuple[str, int]:
    """One mypy run over the package with pyproject.toml's settings (strict rooms included): torch's,
    numpy's, transformers' and Lightning's stubs are read once, not once per test."""
    out, err, status = api.run([
        str(SRC), "--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary",
        "--cache-dir", "/tmp/inplace-doctor-mypy-cache",
    ])
    return out + err, status


def test_package_type_checks(mypy_output):
    text, status = mypy_output
    assert status == 0, text


def _strict_modules() -> set[str]:
    names = set()
    for entry in STRICT:
        name = "inplace_doctor." + entry.removesuffix(".py")
        names |= {name} if entry.endswith(".py") else {name, name + ".*"}
    return names


def _in_strict_room(path: str) -> bool:
    """Whether the file mypy names (relative to the working directory, as it prints it) is in a STRICT room."""
    resolved = Path(path).resolve()
    return any(resolved == SRC / entry or resolved.is_relative_to(SRC / entry) for entry in STRICT)


def test_records_rules_and_render_type_check_strictly(mypy_output):
    """pyproject.toml sets every flag `--strict` sets (as this mypy defines it) on exactly the STRICT
    rooms (the flags mypy applies only to a whole run, on the whole run), and mypy found nothing there."""
    import tomllib

    from mypy.main import define_options
    from mypy.options import PER_MODULE_OPTIONS

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    [strict] = [o for o in config.get("overrides", []) if set(o["module"]) & _strict_modules()]
    assert set(strict["module"]) == _strict_modules()
    _, _, strict_flags = define_options()
    for flag, value in strict_flags:
        where = strict if flag in PER_MODULE_OPTIONS else config
        assert where.get(flag) is value, f"pyproject.toml: {flag} = {str(value).lower()} (set by --strict)"
    text, _ = mypy_output
    errors = [line for line in text.splitlines() if _in_strict_room(line.split(":")[0])]
    assert errors == [], "\n".join(errors)


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
