"""Myths, measured: one experiment per claim of the seed documents, in examples/myths/.

    python -m inplace_doctor.myths                 # run every experiment, print the table
    python -m inplace_doctor.myths c09             # the experiments whose name starts with c09
    python -m inplace_doctor.myths --write         # also write docs/myths.md
    python -m inplace_doctor.myths --check         # exit 1 unless docs/myths.md matches a fresh run
    inplace-doctor myths [NAME]                    # the same table

Each experiment is a small file with `CLAIM`, `SOURCE`, optionally `GPU = True`,
and `run() -> (what it measured, verdict)`; verdicts are TRUE, FALSE, PARTLY.
Experiments that need a GPU are listed as "ready, not run here" without one.
They run from a checkout (the folder examples/myths/ is not installed).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "examples" / "myths"
DOC = ROOT / "docs" / "myths.md"


@dataclass(frozen=True)
class Outcome:
    name: str
    claim: str
    source: str
    measured: str
    verdict: str


def experiments(folder: Path = FOLDER) -> list[Path]:
    return sorted(p for p in folder.glob("c[0-9]*.py"))


def run_one(path: Path) -> Outcome:
    spec = importlib.util.spec_from_file_location(f"_myth_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    claim, source = getattr(module, "CLAIM", path.stem), getattr(module, "SOURCE", "")
    if getattr(module, "GPU", False) and not torch.cuda.is_available():
        return Outcome(path.stem, claim, source, "needs a GPU; the experiment is ready", "ready, not run here")
    rng = torch.random.get_rng_state()
    try:
        measured, verdict = module.run()
    except Exception as e:  # an experiment that breaks says so in the table
        measured, verdict = f"experiment failed: {type(e).__name__}: {e}", "ERROR"
        traceback.print_exc(file=sys.stderr)
    finally:
        torch.random.set_rng_state(rng)
    return Outcome(path.stem, claim, source, measured, verdict)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| experiment | claim | measured | verdict |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(f"| `{o.name}` | {_cell(o.claim)} ({o.source}) | {_cell(o.measured)} | **{o.verdict}** |")
    return "\n".join(lines) + "\n"


def document(outcomes: list[Outcome]) -> str:
    return (
        "# Myths, measured\n\n"
        "Claims from the documents this project grew from (`../shared/seeds`), each checked by a runnable\n"
        "experiment in `examples/myths/` on CPU. Regenerate with `python -m inplace_doctor.myths --write`;\n"
        "a test checks this page against a fresh run. Verdicts follow the measurement, not the blog.\n\n"
        + table(outcomes)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inplace-doctor myths", description="run the myth experiments")
    parser.add_argument("name", nargs="?", default="", help="run only experiments whose name starts with this")
    parser.add_argument("--write", action="store_true", help="write docs/myths.md")
    parser.add_argument("--check", action="store_true", help="exit 1 unless docs/myths.md matches a fresh run")
    ns = parser.parse_args(argv)
    paths = [p for p in experiments() if p.stem.startswith(ns.name)]
    if not paths:
        names = ", ".join(p.stem for p in experiments()) or f"none found in {FOLDER}"
        print(f"inplace-doctor: error: no experiment matches {ns.name!r}; experiments: {names}", file=sys.stderr)
        return 2
    outcomes = [run_one(p) for p in paths]
    print(table(outcomes), end="")
    if ns.write:
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(document(outcomes))
    if ns.check:
        if ns.name or not DOC.is_file() or DOC.read_text() != document(outcomes):
            print("docs/myths.md does not match a fresh run: python -m inplace_doctor.myths --write", file=sys.stderr)
            return 1
    return 1 if any(o.verdict == "ERROR" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
