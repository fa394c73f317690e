"""Documentation that cannot drift: the rule reference is regenerated and compared."""

from __future__ import annotations

from pathlib import Path

from inplace_doctor.rules import RULES
from inplace_doctor.rules.reference import main, pages, stale

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_rule_reference_is_up_to_date() -> None:
    assert stale(DOCS / "rules") == [], "run: python -m inplace_doctor.rules.reference"
    assert main(["--check", "--out", str(DOCS / "rules")]) == 0


def test_every_rule_page_has_an_example_and_a_fix() -> None:
    generated = pages()
    for code in RULES:
        text = generated[f"{code}.md"]
        assert "```python" in text and "Fix:" in text, code


def test_the_check_notices_a_stale_page(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0 and main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "IPD101.md").write_text("old\n")
    (tmp_path / "IPD999.md").write_text("gone\n")
    assert sorted(stale(tmp_path)) == ["IPD101.md", "IPD999.md"]
    assert main(["--check", "--out", str(tmp_path)]) == 1
