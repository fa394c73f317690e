"""The command line, `inplace-doctor`: the top room of the package.

`main.py` assembles the parser and dispatches; each subcommand is one module (`audit`, `verify`,
`fix`, `myths`, `rules` for `rules` and `rule`; `run` is `scripts/run_command.py`, `memory` and
`optimize` are in `measure/`) with `add_parser` and the function that runs it. The argument groups
they share (the model spec, `--input`, `--eval`, `--seed`, `--format`, `--output`,
`--select`/`--ignore`, `--fail-on`, `--stack`, ...) are written once in `args.py`; `model.py`
builds the model a spec names, `output.py` writes results (checked before the work, written
atomically; `provenance.py` tells an earlier report of the tool's by its structure),
`errors.py` the exit codes and the
exceptions behind them, `project.py` loads `[tool.inplace-doctor]` from pyproject.toml. Three rooms:

- `measure/`: `memory` and `optimize`, which measure training steps, and what they share
- `scripts/`: `run` (a user's script run as python would, its steps counted, its traceback kept)
- `proof/`: how `fix` and `run --prove` check a fix on scratch copies of the project (the rounds of
  checks, the copies and the verdict, the child that records a run, confinement, reach, what a run
  produced, the edits written byte for byte)

This room may import everything below it in the package; nothing imports it.
"""

from .main import main, run

__all__ = ["main", "run"]
