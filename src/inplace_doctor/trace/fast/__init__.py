"""The fast tracer (the default): writes seen by one Python kernel per mutating aten overload, hand-
outs, in-place calls and reads only while something is awaited.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `fast_writes`: The fast tracer's writes (issue 26)
- `write_kernels`: Writes seen without a dispatch mode
- `hand_outs`: The fast tracer's hand-outs (issue 26)
- `inplace_entry`: The fast tracer's `InplaceCalls` mode, on the stack only while it has something
  to do (issue 26)
- `pending_reads`: The fast tracer's reads, only while one is awaited (issue 26)
- `suspect_calls`: The fast tracer's reads for IPD105 and IPD106 (issue 26)
- `saved_fast`: The fast tracer's saved tensors
"""
