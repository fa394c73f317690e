"""Aliases and reads: views and handed-out objects that still read what an in-place op overwrote,
caller inputs, writes autograd does not record.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `aliases`: Tensors handed out that share memory with live state
- `stale_aliases`: IPD105 through another object
- `caller_reads`: Writes a call was asked to make into its caller's tensor
- `inplace_calls`: In-place calls whose out-of-place form would leave other references holding the
  original value
- `value_change`: How much an in-place call changes its tensor
- `graph_writes`: Writes autograd does not record into tensors of the graph, and the later ops that
  use them (IPD110)
- `graph_gradients`: What decides an IPD110 prediction at backward
"""
