"""The engines: the jobs inplace-doctor runs on a model, each producing a result.

`audit` (one instrumented forward and backward) and the `watch` session (any code), `memory/`
(where a training step's memory goes), `verify/` (is an in-place configuration equivalent to the
out-of-place program), `optimize/` (decide every in-place flag from evidence), `distributed`
(gathering reports across ranks), `training` (the one copier of a model and its optimizer and
the one training-step driver that memory, verify and optimize share, with `default_loss`) and
`preserve` (leaving the user's model, inputs and RNG state as found). Engines may import the
records (`_compat`, `sites`, `events`, `findings`, `errors`, `report`, `printing`), `trace/` and
`rules/`, and each other without a circle (optimize uses verify and memory, never the reverse);
never `render/`, `cli/`, `api` or the package root: results print through `printing`'s
registry. The folder is `engines/`, not top-level `memory/`, `verify/` and `optimize/`, because
those names are the public functions `inplace_doctor.memory`, `.verify` and `.optimize`: a
subpackage of the same name would be shadowed by, or shadow, the function. For the same reason
no module inside `memory/`, `verify/` or `optimize/` is named after its folder.
"""
