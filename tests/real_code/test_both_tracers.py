"""Every real program of this folder gives the same findings under the fast tracer (the default)
and the deep one (issue 26: "nothing it finds today may be lost in the fast mode").

The bug reports (`bug_reports/`, `bug_reports_more/`) and the correct training programs (`idioms/`, `idioms_more/`) run
as `python <program>.py` would (`runpy`, as `__main__`), once under `watch(deep=True)` and once
under `watch(deep=False)`, with the same seed; the findings are compared by rule, severity, cause
and the lines they name (what overwrote, what saved, what read). An error the program raises
(a bug report's backward) must be the same error in both.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

import inplace_doctor as ipd

HERE = Path(__file__).resolve().parent
PROGRAMS = sorted(
    p for folder in ("bug_reports", "bug_reports_more", "idioms", "idioms_more") for p in (HERE / folder).glob("*.py") if p.name != "run_all.py"
)


@pytest.fixture(autouse=True)
def one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)  # a program that writes files writes them here
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _line(site: Any) -> tuple[str, int | None] | None:
    return None if site is None else (Path(site.file or "").name, site.line)


def _run(path: Path, deep: bool) -> tuple[list[tuple[Any, ...]], str | None]:
    torch.manual_seed(0)
    raised = None
    session = ipd.watch(deep=deep)
    try:  # the error leaves the watch, as it would leave `python <program>.py`: it is a finding too
        with session:
            runpy.run_path(str(path), run_name="__main__")
    except Exception as exc:  # a bug report's program may raise at backward: the same in both
        raised = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    found = sorted(
        (f.code, f.severity.value, str(f.cause), _line(f.mutation), _line(f.saved), _line(getattr(f, "read", None)))
        for f in session.findings
    )
    return found, raised


@pytest.mark.slow
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_fast_tracer_finds_what_the_deep_one_finds(path: Path) -> None:
    deep = _run(path, deep=True)
    fast = _run(path, deep=False)
    assert fast == deep
    if path.parent.name == "idioms" or path.parent.name == "idioms_more":
        assert fast == ([], None)  # correct programs: silent in both


def test_the_bug_reports_are_found_at_all() -> None:
    """The comparison above is not between two empty lists: most bug reports draw a finding."""
    reports = [p for p in PROGRAMS if p.parent.name == "bug_reports"]
    found = [p.stem for p in reports if _run(p, deep=False)[0]]
    assert len(found) >= len(reports) - 4, found
