"""`inplace-doctor run`: a user's script (or `-m module`) run as python would, under watch(), steps
counted, verified, its traceback kept.

Its modules may import every room below cli/ (api, render, engines, the records) and the rest of
cli/ (no circle); nothing below imports them.

- `script`: `inplace-doctor run`
- `script_verify`: `inplace-doctor run --verify`
- `steps`: Counting training steps for `inplace-doctor run --steps N`, and stopping the watch after
  N
- `tracebacks`: The traceback of a script run by `inplace-doctor run`, or of a model, factory or
  module that raised under the other commands, printed as python would print it
- `run_command`: `inplace-doctor run`'s options, its report and its exit code
"""
