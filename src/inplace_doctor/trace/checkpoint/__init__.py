"""Activation checkpointing: regions counted and their recompute compared with the forward, op by op.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `checkpoint_blocks`: A non-reentrant checkpoint region's blocks, counted and watched while a
  tracer runs
- `checkpoint_ops`: The fast tracer's per-op interception inside checkpoint regions (issue 26)
- `recompute`: Checkpoint recompute checked against the forward's values
- `saved_writes`: Kernels that write an argument autograd saved before the kernel ran, checked under
  checkpoint
"""
