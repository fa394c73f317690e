"""Whose exception it is, and what PyTorch's own errors say: the tool's crash told from the program's,
the in-place call an error was raised at.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `blame`: Whose exception is it
- `pytorch_errors`: Errors PyTorch raises in a traced run
- `raised_at`: The in-place call an error was raised at, read from the raising frame's bytecode
- `raised_calls`: The fast tracer's view of in-place calls PyTorch refuses at the call, caught by
  the program or not
"""
