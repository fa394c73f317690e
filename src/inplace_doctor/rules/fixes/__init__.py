"""Fixes as records: the edits that make each fix, built from the source at the site (never from a
sentence), and the order of a training step's lines.

Its modules may import the records and trace/ (for stacks), never engines/, render/ or cli/; the
rule modules import these, not the other way round.

- `fix_builders`: Fix builders
- `fix_flags`: The fix for a module built with `inplace=True`
- `fix_history`: The fix for a write autograd did not record into a tensor of the graph (IPD110), as
  edits
- `fix_moves`: The fix for an update of parameters (an optimizer step, a `no_grad` write to a
  weight) that ran between a forward and the backward needing that forward's values
- `fix_sets`: How the fixes of one finding combine
- `source`: The user's source at a site, read with the standard library's `ast`
- `line_endings`: The line endings of a source file's bytes, which an `Edit`'s texts carry
  (findings.py `Edit`)
"""
