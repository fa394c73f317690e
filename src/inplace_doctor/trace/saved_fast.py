"""The fast tracer's saved tensors: what the pack hook leaves to the node-creation hook.

Every save and every node enters Python (issue 26's MLP: 89 saves and 151 nodes a step), so
each hook does the least it can. Autograd calls the node-creation hook inside the same op call
as the packs before it, right after the node's saves (`torch.autograd.graph.node_creation_hook`:
"the tensors saved for backward have been stored"), so the Python stack, the module running
and the phase are the same at both: `pack` makes the bare record, and the node's hook captures
the stack once for every record packed since the previous node (the records packed since then
are the node's, or an inner node's autograd names none of: CopySlices' own node).

Which field holds which record is read from the node (`SavedTensors.name_node`) the first time
a node type is seen; when every one of its tensor fields held one record, in pack order, that
order is its layout, and a node of that type whose packs number its fields has them in that
order (codegen saves a type's fields in one fixed order, each at most once): named without
reading its fields. A node that saved fewer (a conditional or undefined save), a list field or
a custom `Function` is named from its fields, as before.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .autograd_facts import BATCH_NORM_NODES
from .nodes import record_creation, saved_attrs
from .saved import SavedRecord, SavedTensors, _detach, _DisableTorchDispatch, _dispatch_modes
from .stacks import capture_stack
from .storage import storage_key

_current_node = torch._C._current_autograd_node
_BackwardCFunction = torch.autograd.function.BackwardCFunction
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
#: node name -> (its saved fields in pack order, the op that makes it, that op's name), for node
#: types whose fields all save one tensor
_layouts: dict[str, tuple[tuple[str, ...], Any, str | None]] = {}


class FastSavedTensors(SavedTensors):
    """`SavedTensors` with the fast tracer's hooks: `pack` makes the record, `on_node_now` places
    and names the records packed since the previous node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: weakrefs to the records packed since the last node-creation hook (a record an op made
        #: and dropped, raising before its node existed, is gone by then)
        self._fresh: list[weakref.ref[SavedRecord]] = []
        self._placed = 0  # how many of `_fresh` know where they were saved (a write read them)

    def pack(self, t: torch.Tensor) -> SavedRecord:
        if type(t) is _Tensor or type(t) is _Parameter:
            if _dispatch_modes():
                with _DisableTorchDispatch():  # our own detach is not the user's op
                    alias = _detach(t)
            else:
                alias = _detach(t)
        else:  # a tensor subclass may need its own __torch_dispatch__ for detach
            with self._busy:
                alias = t.detach()
        key = self.saves = self.saves + 1
        record = SavedRecord(alias, key, None, None, False, t._version, t.requires_grad)
        ref = weakref.ref(record)
        self._fresh.append(ref)
        unindexed = self._unindexed
        unindexed.append(ref)
        if len(unindexed) > self._compact_at:
            self._compact()
            self._compact_fresh()
        contents = self.contents
        if contents is not None and (contents.check_all or contents.by_storage or contents.search is not None):
            ptr = storage_key(alias)
            if ptr:
                self._place()  # the content checks read where it was saved now
                contents.on_pack(record, ptr)
        return record

    def _compact_fresh(self) -> None:
        """Drop the freed records' weakrefs from `_fresh` too (packs without a node, for long)."""
        fresh, placed = self._fresh, self._placed
        kept = [ref for ref in fresh[:placed] if ref() is not None]
        self._placed = len(kept)
        self._fresh = kept + [ref for ref in fresh[placed:] if ref() is not None]

    def _place(self) -> Any:
        """Where the records packed since the last node were saved: the stack now (the same op
        call), the module running, the phase. The capture made, or None if all knew already."""
        fresh = self._fresh
        if self._placed == len(fresh):
            return None
        stack, module, in_backward = capture_stack(), self._modules.current, _current_node() is not None
        for i in range(self._placed, len(fresh)):
            record = fresh[i]()
            if record is not None:
                record.stack, record.module, record.in_backward = stack, module, in_backward
        self._placed = len(fresh)
        return stack

    @property
    def by_storage(self) -> dict[int, dict[int, weakref.ref[SavedRecord]]]:
        if self._placed != len(self._fresh):  # a write inside the op that saved: its records placed first
            self._place()
        return super().by_storage

    def on_node_now(self, node: Any, op: Any, name: str | None) -> None:
        """The node-creation hook: the records packed since the last node placed and named (none is
        held for later: a node held would keep a graph dropped without backward alive); `name`:
        the node's, None when its type saves no tensor. Where a node was made is what its records
        say (`nodes.origin_of` reads them), else recorded in it."""
        fresh = self._fresh
        if not fresh:
            record_creation(node, self._modules.current, op)
            return
        if self._placed:  # a write inside the op placed some already
            stack = self._place()
            records = [record for ref in fresh if (record := ref()) is not None]
        else:  # `_place` inlined: one loop places and collects them
            stack, module, in_backward = capture_stack(), self._modules.current, _current_node() is not None
            records = []
            for ref in fresh:
                record = ref()
                if record is not None:
                    record.stack = stack
                    record.module = module
                    record.in_backward = in_backward
                    records.append(record)
        self._fresh = []
        self._placed = 0
        if name is None or not self._name(node, op, name, records):
            record_creation(node, self._modules.current, op, stack)

    def _name(self, node: Any, op: Any, name: str, records: list[SavedRecord]) -> bool:
        known = _layouts.get(name)
        if known is not None and len(records) == len(known[0]) and op is known[1]:
            serial = self._nodes_seen = self._nodes_seen + 1
            op_called = known[2]
            for record, field in zip(records, known[0]):
                record.node = name
                record.node_serial = serial
                record.field = field
                record.op = op_called
            return True
        found = self.name_node(node, op, name)
        if found and known is None and _has_layout(node, name, records, self._nodes_seen):
            fields = tuple(record.field for record in records)
            _layouts[name] = (fields, op, records[0].op)  # type: ignore[assignment]
        return found


def _has_layout(node: Any, name: str, records: list[SavedRecord], serial: int) -> bool:
    """Whether `node` (just named, `serial`) held `records`, one in each of its tensor fields."""
    if isinstance(node, _BackwardCFunction) or name in BATCH_NORM_NODES:  # per-call types; fields read per node
        return False
    fields = {record.field for record in records if record.node_serial == serial}
    attrs = {field for _, field in saved_attrs(node)}
    return len(fields) == len(records) == len(attrs) and fields == attrs
