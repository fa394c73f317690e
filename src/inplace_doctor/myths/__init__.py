"""Myths, measured: one experiment per claim of the seed documents, shipped in `experiments/`.

    inplace-doctor myths                     # run every experiment, print the table
    inplace-doctor myths c09                 # the experiments whose name starts with c09
    python -m inplace_doctor.myths [NAME]    # the same
    python tools/myths.py --write|--check    # from a checkout: write or check docs/myths.md

Each experiment is a small file with `CLAIM`, `SOURCE`, optionally `GPU = True`,
and `run() -> (what it measured, verdict)`; verdicts are TRUE, FALSE, PARTLY.
Experiments that need a GPU are listed as "ready, not run here" without one.
The experiments are package data, not modules of the package: each is loaded by
its path and imports inplace_doctor as any user's code does. This room (the
runner) may import the rooms below it; only cli/ imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

FOLDER = Path(__file__).resolve().parent / "experiments"


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


def run_matching(name: str) -> list[Outcome] | None:
    """Run the experiments whose name starts with `name` and print their table; None, after
    one error line on stderr, when no experiment matches."""
    paths = [p for p in experiments() if p.stem.startswith(name)]
    if not paths:
        names = ", ".join(p.stem for p in experiments()) or f"none found in {FOLDER}"
        print(f"inplace-doctor: error: no experiment matches {name!r}; experiments: {names}", file=sys.stderr)
        return None
    outcomes = [run_one(p) for p in paths]
    print(table(outcomes), end="")
    return outcomes


def exit_status(outcomes: list[Outcome]) -> int:
    """1 when an experiment broke (verdict ERROR), else 0."""
    return 1 if any(o.verdict == "ERROR" for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inplace-doctor myths", description="run the myth experiments")
    parser.add_argument("name", nargs="?", default="", help="run only experiments whose name starts with this")
    ns = parser.parse_args(argv)
    outcomes = run_matching(ns.name)
    return 2 if outcomes is None else exit_status(outcomes)
