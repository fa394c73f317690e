"""What the manual says of the API and the command line is what the code does (issue 39): the
signatures in docs/python-api.md, the README's rule table, the `--format` names, the default tracer."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import inplace_doctor as ipd
from inplace_doctor.cli.measure import training
from inplace_doctor.engines import tracer_mode
from inplace_doctor.render import FORMATS
from inplace_doctor.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def documented_parameters(text: str, name: str) -> list[str]:
    """The parameter names of the `name(...)` signature the page shows in backticks."""
    m = re.search(rf"`{name}\((.*?)\)`", text)
    assert m, f"no `{name}(...)` signature"
    return [part.split("=")[0].strip().lstrip("*") for part in m.group(1).split(",")]


@pytest.mark.parametrize("name", ["audit", "watch", "verify"])
def test_the_api_page_shows_every_parameter(name: str) -> None:
    real = [p.name for p in inspect.signature(getattr(ipd, name)).parameters.values()]
    assert documented_parameters(_flat(DOCS / "python-api.md"), name) == real


def test_the_readme_rule_table_lists_every_rule() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Rules\n"):]
    assert re.findall(r"^\| (IPD\d+) \|", section, re.M) == sorted(RULES)


def test_the_format_names_are_those_format_accepts() -> None:
    """HTML is `--html FILE`, not a `--format` (render.FORMATS holds the report formats)."""
    cli = _flat(DOCS / "cli.md")
    formats = cli[cli.index("## Report formats"):]
    said = re.search(r"`--format` takes (.*?) for a report .*? and (.*?) for `memory` and `optimize`", formats)
    assert said, "docs/cli.md no longer says which names `--format` takes"
    assert re.findall(r"`(\w+)`", said.group(1)) == list(FORMATS)
    assert re.findall(r"`(\w+)`", said.group(2)) == list(training.FORMATS)
    for doc in (ROOT / "README.md", *DOCS.glob("*.md")):
        assert "--format html" not in doc.read_text(), doc.name


def test_the_fast_tracer_is_the_documented_default(monkeypatch) -> None:
    monkeypatch.delenv(tracer_mode.ENVIRONMENT, raising=False)
    assert tracer_mode.asked(None) is None and tracer_mode.choose(list(RULES.values()), None) == []
    assert "(the fast tracer, the default)" in _flat(ROOT / "README.md")
    assert "The *fast tracer*, the default," in _flat(DOCS / "how-it-works.md")
    assert "watch(deep=True)" in _flat(DOCS / "how-it-works.md")
