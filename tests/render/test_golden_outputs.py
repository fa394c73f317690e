"""Golden outputs: the text, JSON and SARIF reports of three runs, compared byte for byte.

Each case runs the CLI in this process (`inplace_doctor.cli.main.main(argv)`, in a
fresh thread so that pytest's frames do not show as the user's: conftest.in_fresh_thread)
from the repository root with `--format F --output FILE`, as a user would, and
compares FILE, normalised, with tests/render/golden/<case>.<ext>. (Checked once by
hand: the nine files equal those of `python -m inplace_doctor ...` subprocesses.)

Normalisation (`normalise`), all of it:
- the repository root (as given and resolved) -> `<ROOT>`;
- `torch.__version__` -> `<TORCH>`;
- the tool's version in SARIF's driver (`"version"`, `"semanticVersion"`) -> `<VERSION>`;
- the timings of `run`'s summary note: `(1.23 s from the start` -> `(<S> s from the start`,
  `4.5 ms per step` -> `<MS> ms per step`.

`pytest tests/render --regen-golden` rewrites the golden files instead of comparing
(the test then passes with a warning naming each file it wrote).
"""

from __future__ import annotations

import difflib
import re
import warnings
from pathlib import Path

import pytest
import torch
from conftest import in_fresh_thread

import inplace_doctor as ipd
from inplace_doctor.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"

FORMATS = {"text": "txt", "json": "json", "sarif": "sarif"}

# case -> (subcommand, arguments after the tool's options, expected exit status)
CASES: dict[str, tuple[str, list[str], int]] = {
    "audit_sigmoid_then_relu": ("audit", ["inplace_doctor.examples:sigmoid_then_relu", "--input", "2x8"], 1),
    "run_IPD105_residual_inplace_relu": ("run", ["tests/rules/IPD105/flagged/residual_inplace_relu.py"], 1),
    "run_IPD107_best_state_dict_restored": ("run", ["tests/rules/IPD107/flagged/best_state_dict_restored.py"], 1),
}


def normalise(text: str) -> str:
    for root in sorted({str(ROOT), str(ROOT.resolve())}, key=len, reverse=True):
        text = text.replace(root, "<ROOT>")
    text = text.replace(torch.__version__, "<TORCH>")
    for key in ("version", "semanticVersion"):
        text = text.replace(f'"{key}": "{ipd.__version__}"', f'"{key}": "<VERSION>"')
    text = re.sub(r"\(\d+(\.\d+)? s from the start", "(<S> s from the start", text)
    return re.sub(r"\d+(\.\d+)? ms per step", "<MS> ms per step", text)


def test_normalise_is_small_and_explicit() -> None:
    raw = f"{ROOT}/x.py torch {torch.__version__}; watched 1 backward pass (4.56 s from the start, 12.3 ms per step"
    assert normalise(raw) == "<ROOT>/x.py torch <TORCH>; watched 1 backward pass (<S> s from the start, <MS> ms per step"
    sarif = f'"version": "2.1.0", "version": "{ipd.__version__}", "semanticVersion": "{ipd.__version__}"'
    assert normalise(sarif) == '"version": "2.1.0", "version": "<VERSION>", "semanticVersion": "<VERSION>"'


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("case", list(CASES))
def test_golden_output(
    case: str,
    fmt: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    regen_golden: bool,
) -> None:
    command, args, expected_status = CASES[case]
    out = tmp_path / f"report.{FORMATS[fmt]}"
    monkeypatch.chdir(ROOT)  # paths in the reports are relative to the working directory
    status = in_fresh_thread(main, [command, "--format", fmt, "--output", str(out), *args])
    printed = capsys.readouterr()
    assert status == expected_status, printed.err
    # With --output the tool writes only FILE; these scripts print nothing of their own.
    assert (printed.out, printed.err) == ("", ""), printed
    fresh = normalise(out.read_text(encoding="utf-8"))

    golden = GOLDEN / f"{case}.{FORMATS[fmt]}"
    if regen_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(fresh, encoding="utf-8")
        warnings.warn(f"regenerated {golden.relative_to(ROOT)}", UserWarning, stacklevel=1)
        return
    assert golden.is_file(), f"no golden file {golden.relative_to(ROOT)}: run pytest tests/render --regen-golden"
    expected = golden.read_text(encoding="utf-8")
    if fresh != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), fresh.splitlines(keepends=True), str(golden.name), "fresh output"
            )
        )
        pytest.fail(
            f"{golden.relative_to(ROOT)} differs from fresh output "
            f"(if the change is intended: pytest tests/render --regen-golden):\n{diff}"
        )


def test_every_golden_file_belongs_to_a_case() -> None:
    """A renamed or removed case must not leave a stale golden file behind."""
    expected = {f"{case}.{ext}" for case in CASES for ext in FORMATS.values()}
    present = {p.name for p in GOLDEN.iterdir() if p.name != "README.md"}
    assert present == expected
