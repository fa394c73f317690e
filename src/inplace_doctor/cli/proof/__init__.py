"""How `fix` proves a fix: the user's program copied, run with and without the edit in confined child
processes, and everything it produced compared.

Its modules may import every room below cli/ (api, render, engines, the records) and the rest of
cli/ (no circle); nothing below imports them.

- `prove`: Checking a fix on the user's own program before `fix` offers it as proven
- `recorder`: What a program computed, step by step, as exact fingerprints
- `fix_search`: Which fixes prove out on the user's program
- `proof_seeds`: The same random numbers in every proof run, and what else a program reads that
  seeds do not fix
- `confine`: A proof run changes nothing outside its copy of the project (issue 38, item 4)
- `reach`: Whether a proof run reached the lines its verdict is about (issue 38, item 1)
- `produced`: What a proof compares besides the recorded values, and when it proves nothing (issue
  38, items 1-2)
- `repeat`: Whether the intended program computes (and prints) the same twice from the same seeds
- `copy_room`: The scratch copies a proof runs in
- `edited_lines`: How a finding's line is followed through the edits `fix` makes
- `fix_exit`: What `inplace-doctor fix` exits with
- `source_edits`: Applying `Edit` records to source files byte for byte
- `model_entry`: A model factory run as a program, so `fix` can check its fixes as it checks a
  script's
"""
