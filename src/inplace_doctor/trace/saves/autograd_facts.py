"""What autograd nodes really read at backward: facts the tracer needs beyond versions."""

from __future__ import annotations

from typing import Any

# Batch norm saves its running statistics but, in training mode, its backward
# uses the batch statistics only. The running-stat update writes those buffers
# without a version bump, which must not be mistaken for corruption.
BATCH_NORM_NODES = frozenset(
    {
        "NativeBatchNormBackward0",
        "CudnnBatchNormBackward0",
        "MiopenBatchNormBackward0",
        "NativeBatchNormLegitBackward0",
    }
)
_RUNNING_STATS = frozenset({"running_mean", "running_var"})


def saved_field_is_read(node: Any, node_name: str, field: str | None) -> bool:
    """False when `node`'s backward never reads the saved `field`."""
    if node_name in BATCH_NORM_NODES and field in _RUNNING_STATS:
        return not bool(getattr(node, "_saved_training", False))
    return True
