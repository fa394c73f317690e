"""Findings across a torch.distributed job: each rank's report carries its rank, and
`gather()` collects every rank's findings on rank 0.

    with ipd.watch(ddp_model) as session:
        train()
    merged = ipd.gather(session.report())   # rank 0: every rank's findings; others: None

Each finding gathered keeps its rank in `finding.ranks`; the same finding
raised on several ranks is listed once with all of them in `ranks`.
DDP's own machinery (bucket views, `broadcast_` into buffers, `copy_` of
parameters) is not misreported: tests/real_code/test_idioms.py runs a 2-process gloo job.
"""

from __future__ import annotations

from typing import Any

import torch

from ..report import Report


def current_rank() -> int | None:
    """This process's rank in the default process group, or None outside one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return None


def gather(report: Report, dst: int = 0, group: Any = None) -> Report | None:
    """Collect every rank's findings on rank `dst` (a collective: every rank must call it).

    Returns the merged report on `dst` and None on the other ranks; outside a
    process group, the report itself.
    """
    rank = current_rank()
    if rank is None:
        return report
    dist = torch.distributed
    world = dist.get_world_size(group)
    payload = [f.with_(ranks=(rank,)) for f in report.findings]
    received: list[Any] | None = [None] * world if rank == dst else None
    dist.gather_object(payload, received, dst=dst, group=group)
    if rank != dst:
        return None
    merged: dict[Any, Any] = {}
    for findings in received or []:
        for f in findings or []:
            key = f.dedupe_key
            if key in merged:
                old = merged[key]
                merged[key] = old.with_(ranks=tuple(sorted(set(old.ranks) | set(f.ranks))))
            else:
                merged[key] = f
    out = Report(
        findings=list(merged.values()),
        target=report.target,
        mode=report.mode,
        backward=report.backward,
        notes=list(report.notes) + [f"gathered from {world} ranks on rank {dst}"],
        stats=dict(report.stats),
        command=report.command,
        root_label=report.root_label,
    )
    out.rank = dst
    return out
