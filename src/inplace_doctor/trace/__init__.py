"""The tracer and what it needs to know about PyTorch: one instrumented run, reported as events.

`tracer.Tracer` runs a `TorchDispatchMode` (`dispatch_mode`: every write) plus
saved-tensor hooks and autograd's node-creation hook (`saved`: every saved
tensor, the node holding it, its release) plus global module hooks
(`modules.ModulePaths`: module path, call index and inplace flag of the module
running each op); `writes` decides what each write overwrote, and
`pytorch_errors` says where PyTorch's own errors were raised. It emits
`events` to a sink and knows no rule. Around it: in-place calls whose
out-of-place form would keep the original value (`inplace_calls`),
`state_dict()` aliases held as snapshots (`aliases`), both talking to the
tracer only through `owner.TraceOwner`; where modules with an `inplace` flag
were constructed (`origins`); facts about aten ops (`ops`) and autograd nodes
(`autograd_facts`); user stacks and tracebacks (`stacks`); storage spans
(`storage`). Modules here import only the records (`_compat`, `sites`,
`events`, `findings`, `errors`, `report`, `printing`) and each other, without
circles; never rules/, engines/, render/ or cli/.
"""
