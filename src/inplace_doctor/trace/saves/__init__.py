"""Saved tensors: a record per save, the node and field that hold it, when it is freed, and the bytes
of those whose memory was handed out.

Its modules may import the records (`sites`, `events`, `causes`), `_compat` and the other rooms of
trace/ (no circle), never rules/, engines/, render/ or cli/.

- `saved`: Saved tensors: a record per save, which node holds it, and when it is freed
- `saved_place`: Who saved a tensor and where (`SavedRecord.place()`), for reports that name many
  saves at once
- `autograd_facts`: What autograd nodes really read at backward
- `contents`: Saved tensors whose bytes change with no op at all
- `fingerprint`: A fingerprint of a tensor's bytes
- `storage`: Which bytes of which storage a tensor covers
- `step_lines`: The line that wrote a saved tensor outside PyTorch, looked for in the script's next
  watched steps
- `write_lines`: The line that wrote a saved tensor outside PyTorch, found in a replay of a
  repeatable run
"""
