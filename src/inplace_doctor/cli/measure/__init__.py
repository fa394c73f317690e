"""The jobs that measure training steps of a model: `memory` (where memory goes) and `optimize`
(which in-place sites to switch), and what both share.

Its modules may import every room below cli/ (api, render, engines, the records) and the rest of
cli/ (no circle); nothing below imports them.

- `memory`: `inplace-doctor memory`: where memory goes, and why autograd keeps it
- `optimize`: `inplace-doctor optimize`: decide per call site, write `inplace.toml`, measure
- `training`: what `memory` and `optimize` share: the optimizer, the steps, the loss they measure
"""
