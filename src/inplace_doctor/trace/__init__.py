"""The tracer and what it needs to know about PyTorch: one instrumented run, reported as events.

What every tracer shares lives here: `tracer.Tracer` (the context manager a session opens, built
from instruments chosen once), `owner` (the `TraceOwner` the instruments see, the busy flag, the
sink), `writes` (what each write overwrote: saved tensors, caller inputs, held aliases) and `ops`
(what an aten op writes, from its schema). The rest stands in rooms a reader can name:

- `fast/`: the fast tracer, the default (a Python kernel per mutating aten overload; reads only
  while one is awaited)
- `deep/`: the deep tracer (one `TorchDispatchMode` every op passes through)
- `saves/`: saved tensors (a record per save, its node and field, its release, handed-out bytes)
- `reads/`: aliases and reads (views, `state_dict()` snapshots, caller inputs, IPD110's graph writes)
- `checkpoint/`: checkpoint regions and their recompute
- `places/`: where an op ran (stacks, user files, module paths, constructors, autograd nodes)
- `raised/`: whose exception it is, and what PyTorch's own errors say
- `process/`: the process-wide patches the sessions share

It emits `events` to a sink and knows no rule. Modules here import only the records (`_compat`,
`sites`, `events`, `causes`, `findings`, `errors`, `printing`) and each other, without circles;
never rules/, engines/, render/ or cli/.
"""
