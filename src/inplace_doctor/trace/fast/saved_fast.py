"""The fast tracer's saved tensors: the node-creation hook names a node's saves by their pack order.

Every save and every node enters Python (issue 26's MLP: 89 saves and 151 nodes a step), so
each hook does the least it can. `pack` (`SavedTensors.pack`, shared) makes the record with where it was saved (the stack,
captured in C, the module running, the phase): a save is not always followed by its node's hook
(non-reentrant checkpoint's `_NoopSaveInputs` saves the region's inputs, and no node-creation
hook runs for it before the region's first op), so where it was saved cannot wait for a hook.

Which field holds which record is read from the node (`SavedTensors.name_node`) the first time
a node type is seen; when every one of its tensor fields held one record, in pack order, that
order is its layout, and a node of that type whose packs since the previous node's hook number
its fields has them in that order (codegen saves a type's fields in one fixed order, each at
most once): named without reading its fields. A node that saved fewer (a conditional or
undefined save), a list field, a custom `Function`, or one whose hook follows saves that are not
all its own is named from its fields, as before.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._compat import RAW_SAVED_PREFIX as _RAW_SAVED_PREFIX
from ..places.nodes import record_creation, saved_attrs
from ..saves.autograd_facts import BATCH_NORM_NODES
from ..saves.saved import SavedRecord, SavedTensors

_current_node = torch._C._current_autograd_node
_BackwardCFunction = torch.autograd.function.BackwardCFunction
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter
#: node name -> (its saved fields in pack order, the op that makes it, that op's name, the first
#: field's `_raw_saved_` attribute), for node types whose fields all save one tensor
_layouts: dict[str, tuple[tuple[str, ...], Any, str | None, str]] = {}


class FastSavedTensors(SavedTensors):
    """`SavedTensors` with the fast tracer's node-creation hook: `on_node_now` names the records
    packed since the previous node at once (`SavedTensors.pack` keeps them in `_fresh`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # `pack` keeps here the records it made since the last node-creation hook (a record an op
        # made and dropped, raising before its node existed, is gone by then)
        self._fresh = []

    def on_node_now(self, node: Any, op: Any, name: str | None) -> None:
        """The node-creation hook: the records packed since the last node named (none is held for
        later: a node held would keep a graph dropped without backward alive); `name`: the node's,
        None when its type saves no tensor. Where a node was made is what its records say
        (`nodes.origin_of` reads them), else recorded in it."""
        fresh = self._fresh
        if not fresh:
            record_creation(node, self._modules.current, op)
            return
        if name is None:  # saves nothing: the records are a later node's (`h.mul_(h)` packs `other`, then
            record_creation(node, self._modules.current, op)  # clones `self` under a node of its own)
            return
        self._fresh = []
        records = [record for ref in fresh if (record := ref()) is not None]
        # A node type of known layout (`_layouts`), inlined: it runs for every node that saves.
        known = _layouts.get(name)
        if known is not None and records and len(records) == len(known[0]) and op is known[1]:
            try:  # whether the node's first field holds the first record: its own, not a save no hook followed
                holds = getattr(node, known[3]).data is records[0]
            except (AttributeError, RuntimeError):  # freed already, or not a field of this node
                holds = False
            if holds:
                serial = self._nodes_seen = self._nodes_seen + 1
                op_called = known[2]
                for record, field in zip(records, known[0]):
                    record.node = name
                    record.node_serial = serial
                    record.field = field
                    record.op = op_called
                return
        if not self._name_from_fields(node, op, name, records, known is None):
            record_creation(node, self._modules.current, op)

    def _name_from_fields(self, node: Any, op: Any, name: str, records: list[SavedRecord], new: bool) -> bool:
        """Name `node`'s records from its fields; a node type not `new` to `_layouts` whose records
        were one a field, in pack order, gives its layout."""
        found = self.name_node(node, op, name)
        if found and new and records and _has_layout(node, name, records, self._nodes_seen):
            fields = tuple(record.field or "" for record in records)  # all named: `_has_layout`
            _layouts[name] = (fields, op, records[0].op, _RAW_SAVED_PREFIX + fields[0])
        return found


def _has_layout(node: Any, name: str, records: list[SavedRecord], serial: int) -> bool:
    """Whether `node` (just named, `serial`) held `records`, one in each of its tensor fields."""
    if isinstance(node, _BackwardCFunction) or name in BATCH_NORM_NODES:  # per-call types; fields read per node
        return False
    fields = {record.field for record in records if record.node_serial == serial}
    attrs = {field for _, field in saved_attrs(node)}
    return len(fields) == len(records) == len(attrs) and fields == attrs
