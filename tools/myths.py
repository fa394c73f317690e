"""Write or check docs/myths.md from a fresh run of the myth experiments (run from a checkout).

    python tools/myths.py            # run every experiment, print the table
    python tools/myths.py c09        # only the experiments whose name starts with c09
    python tools/myths.py --write    # also write docs/myths.md
    python tools/myths.py --check    # exit 1 unless docs/myths.md matches a fresh run

The experiments and their runner ship in the package (`inplace_doctor.myths`,
`inplace-doctor myths`); this page of the checkout is the only part that does not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inplace_doctor.myths import Outcome, exit_status, run_matching, table

DOC = Path(__file__).resolve().parents[1] / "docs" / "myths.md"


def document(outcomes: list[Outcome]) -> str:
    return (
        "# Myths, measured\n\n"
        "Claims from the documents this project grew from (`../shared/seeds`), each checked by a runnable\n"
        "experiment in `src/inplace_doctor/myths/experiments/` on CPU. Regenerate with `python tools/myths.py --write`;\n"
        "a test checks this page against a fresh run. Verdicts follow the measurement, not the blog.\n\n"
        + table(outcomes)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/myths.py", description="run the myth experiments; write or check docs/myths.md")
    parser.add_argument("name", nargs="?", default="", help="run only experiments whose name starts with this")
    parser.add_argument("--write", action="store_true", help="write docs/myths.md")
    parser.add_argument("--check", action="store_true", help="exit 1 unless docs/myths.md matches a fresh run")
    ns = parser.parse_args(argv)
    outcomes = run_matching(ns.name)
    if outcomes is None:
        return 2
    if ns.write:
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(document(outcomes))
    if ns.check and (ns.name or not DOC.is_file() or DOC.read_text() != document(outcomes)):
        print("docs/myths.md does not match a fresh run: python tools/myths.py --write", file=sys.stderr)
        return 1
    return exit_status(outcomes)


if __name__ == "__main__":
    sys.exit(main())
