# mypy: ignore-errors
"""An in-place collate with worker processes does not crash; with num_workers=0 it mutates the dataset."""

import torch
from torch.utils.data import DataLoader, TensorDataset

CLAIM = "in-place ops in a DataLoader collate_fn race between workers and segfault"
SOURCE = "seed 004"


def _collate(batch: list[tuple[torch.Tensor]]) -> torch.Tensor:
    for (t,) in batch:
        t.mul_(2)  # in place on the dataset's own rows
    return torch.stack([t for (t,) in batch])


def run() -> tuple[str, str]:
    data = torch.ones(64, 4)
    n = sum(1 for _ in DataLoader(TensorDataset(data), batch_size=8, num_workers=2, collate_fn=_collate))
    intact_with_workers = bool((data == 1).all())
    for _ in DataLoader(TensorDataset(data), batch_size=8, num_workers=0, collate_fn=_collate):
        pass
    mutated = bool((data == 2).all())
    return (f"{n} batches with 2 workers, no crash, dataset intact (copy-on-write): {intact_with_workers}; "
            f"num_workers=0 doubled the dataset in place: {mutated}", "PARTLY" if intact_with_workers and mutated else "TRUE")
