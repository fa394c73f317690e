"""One rank of the 2-process DDP test in test_idioms.py (not a test module itself).

`run(rank, world, port, result_dir)` is the target the test starts in each process (forked,
so torch is not imported again); `python _ddp_worker.py RANK WORLD PORT RESULT_DIR` runs one
rank standalone. Trains a small conv net with BatchNorm (so DDP
broadcasts buffers every forward) and ReLU(inplace=True) for 2 steps of 2 micro-batches (the
first under `no_sync()`), without watch(), inside watch(), and with DDP itself built inside
watch(), all from the same seeds, and writes the findings and a comparison to
RESULT_DIR/rank{RANK}.json.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build(seed: int) -> tuple[DDP, torch.optim.Optimizer]:
    torch.manual_seed(seed)  # same on every rank; DDP broadcasts rank 0's state anyway
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    model = DDP(net)  # buffers are broadcast from rank 0 at every forward by default
    assert model.will_sync_module_buffers()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model: DDP, opt: torch.optim.Optimizer, rank: int) -> None:
    torch.manual_seed(100 + rank)  # each rank its own data
    for _ in range(2):
        opt.zero_grad()
        with model.no_sync():  # gradient accumulation: the first micro-batch skips the all-reduce
            x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
            (F.cross_entropy(model(x), y) / 2).backward()
        x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
        (F.cross_entropy(model(x), y) / 2).backward()
        opt.step()


def state(model: DDP) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    out.update({f"{k}.grad": p.grad.detach().clone() for k, p in model.module.named_parameters()})
    return out


def run(rank: int, world: int, port: int, result_dir: str) -> None:
    """Rank `rank`'s whole job; writes `result_dir/rank{rank}.json`. Usable as a
    `torch.multiprocessing.start_processes` target (its first argument is the rank)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
        WORLD_SIZE=str(world), RANK=str(rank),
    )
    result: dict = {"rank": rank, "error": None, "findings": []}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        import inplace_doctor as ipd

        model, opt = build(0)
        train(model, opt, rank)
        plain = state(model)

        model, opt = build(0)
        with ipd.watch(model) as session:
            train(model, opt, rank)
        watched = state(model)

        # DDP constructed inside watch() too: its parameter and buffer broadcast is traced.
        with ipd.watch() as session_inside:
            model, opt = build(0)
            train(model, opt, rank)
        built_inside = state(model)

        result["findings"] = [
            {"code": f.code, "severity": str(f.severity), "message": f.message}
            for s in (session, session_inside)
            for f in s.findings
        ]
        result["saves"] = session.tracer.saves
        result["writes"] = session.tracer.writes
        differ = [k for k in plain if not torch.equal(plain[k], watched[k])]
        differ += [f"{k} (DDP built inside watch)" for k in plain if not torch.equal(plain[k], built_inside[k])]
        result["identical_to_plain"] = not differ
        result["differ"] = differ
        result["checksum"] = [float(p.detach().double().sum()) for p in model.module.parameters()]
        dist.barrier()
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        dist.destroy_process_group()
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":  # python _ddp_worker.py RANK WORLD PORT RESULT_DIR
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
