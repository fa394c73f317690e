"""Run idiom scripts of this folder one after the other, each as `__main__` (as `python
<script>.py` would), in one interpreter so that torch is imported once.

    python -m inplace_doctor run tests/real_code/idioms_more/run_all.py [NAME ...]

Each script's start is announced on stdout as `== NAME`.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["sam", "ppo_cleanrl", "lookahead"]


def main(names: list[str]) -> None:
    for name in names or DEFAULT:
        print(f"== {name}", flush=True)
        runpy.run_path(str(HERE / f"{name}.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
