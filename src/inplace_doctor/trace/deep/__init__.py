"""The deep tracer: one `TorchDispatchMode` every aten op passes through, and the per-op registrations
its users make.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `dispatch_mode`: The deep tracer's `TorchDispatchMode`
- `per_op`: The tracer's per-op dispatch mode
"""
