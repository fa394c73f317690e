"""memory: where a training step's memory goes, and why autograd keeps it.

`result` holds what `inplace_doctor.memory()` returns (`MemoryReport`, its per-phase `Peak`s
and their `Holding`s, the byte `Category`s); `ledger` the `TorchDispatchMode` that counts every
live storage as MemTracker does; `measure` runs and times training steps on copies under it.
Exports `measure_memory` (the public `inplace_doctor.memory`), `measure_owned` and
`times_owned` (optimize's measurements on copies it made), and the records.
It may import the records, `trace/`, `rules/` and `engines/training.py`/`preserve.py`; never verify/ or optimize/.
"""

from .measure import measure_memory, measure_owned, times_owned
from .result import PHASES, Category, Holding, MemoryReport, Peak

__all__ = ["PHASES", "Category", "Holding", "MemoryReport", "Peak", "measure_memory", "measure_owned", "times_owned"]
