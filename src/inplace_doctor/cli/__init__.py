"""The command line, `inplace-doctor`: the top room of the package.

`main.py` assembles the parser and dispatches; each subcommand is one module
(`audit`, `verify`, `memory`, `optimize`, `run_command` for `run`, `myths`,
`rules` for `rules` and `rule`) with `add_parser` and the function that runs
it. The argument groups they share (the model spec, `--input`, `--eval`,
`--seed`, `--format`, `--output`, `--select`/`--ignore`, `--fail-on`,
`--stack`, ...) are written once in `args.py`; `model.py` builds the model a
spec names, `output.py` writes results (checked before the work, written
atomically; `provenance.py` tells an earlier report of the tool's by its
structure), `training.py` holds what `memory` and
`optimize` share, `errors.py` the exit codes and the exceptions behind them.
`script.py` runs a user's script for `run` (with `steps.py` counting training
steps and `tracebacks.py` printing the script's traceback as python would);
`project.py` loads `[tool.inplace-doctor]` from pyproject.toml. `fix` (`fix.py`)
and `run --prove` check fixes on scratch copies of the project: `fix_search.py`
(the rounds of checks), `prove.py` (the copies and the verdict), `recorder.py` (the
child that records a run), with `confine.py`, `reach.py`, `produced.py`,
`repeat.py`, `proof_seeds.py`, `copy_room.py`, `edited_lines.py`,
`source_edits.py` and `fix_exit.py` (docs/architecture.md says each). This room may
import everything below it in the package; nothing imports it.
"""

from .main import main, run

__all__ = ["main", "run"]
