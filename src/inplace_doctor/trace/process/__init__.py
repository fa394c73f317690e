"""Process-wide changes the sessions share (patches, kernel registration, swapped code, threads,
compiled code, torch.func): made by the first in, undone by the last out.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `shared_patches`: Process-wide changes the sessions share
- `kernel_registration`: The write kernels' process-wide registration
- `code_swap`: Torch's functions whose `__code__` is swapped for an entry code of the same signature
  while a session runs
- `threads`: Threads the traced code starts, which the tracer does not see into
- `compiled`: `torch.compile`d code runs eagerly while the tracer runs, and is counted so the report
  can say so
- `transforms`: `torch.func` transforms that refuse saved-tensor hooks run, while tracing, with ours
  set aside
- `fast_paths`: PyTorch's fused inference paths taken under a session exactly as without one
"""
