"""One rank of the 2-process FSDP2 (`fully_shard`) test in test_fsdp.py (not a test module itself).

`run(rank, world, port, result_dir)` is the target the test starts in each process (forked, so
torch is not imported again). The model is sharded as FSDP2's docs show it: each block, then the
root (`fully_shard(block)` for each, then `fully_shard(model)`), trained with SGD for 2 steps
without watch() and inside watch() from the same seeds; then a copy with a planted in-place bug
in a block's forward. Writes what it saw to RESULT_DIR/rank{RANK}.json.

What FSDP2 itself writes during a step, and why none of it is an in-place hazard (the test
asserts that no finding comes from it):
- `fsdp.split_with_sizes_copy` before each block's forward and again before its backward: the
  all-gathered shards are copied into the unsharded parameters. Between the two, FSDP2 frees the
  unsharded storage (`untyped_storage().resize_(0)`, no dispatch op) and the copy before backward
  writes back exactly the values forward used: the optimizer updates only the sharded DTensor
  parameters, after backward. The version counter is left as autograd saved it. The tool skips
  the `fsdp::` ops' writes as FSDP's own: when the allocator gave the refilled storage the same
  address, the copy looked like a `.data` write to the weights forward saved (IPD104, flaky).
- `fsdp.chunk_cat` and `copy_` in the post-backward reduce-scatter: fresh gradient buffers and
  the sharded `.grad`, which no graph saved.
- `add_` on `DTensor`s in `opt.step()`: the local shards of the sharded parameters, which no
  graph saved either (forward saved the unsharded parameters, other memory).
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, buggy: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gate = nn.Sigmoid()
        self.buggy = buggy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate(self.fc(x))  # SigmoidBackward0 saves its output
        if self.buggy:
            h.mul_(2)  # overwrites it: backward raises
        return h


def build(buggy: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(Block(False), Block(buggy), nn.Linear(8, 1))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> None:
    torch.manual_seed(100 + rank)  # each rank its own data
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()


def full_state(model: nn.Module) -> list[torch.Tensor]:
    return [p.full_tensor().detach().clone() for p in model.parameters()]  # a collective: every rank


def run(rank: int, world: int, port: int, result_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", WORLD_SIZE=str(world), RANK=str(rank)
    )
    result: dict = {"rank": rank, "error": None}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        import inplace_doctor as ipd

        model, opt = build()
        train(model, opt, rank)
        plain = full_state(model)

        model, opt = build()
        with ipd.watch(model) as session:
            train(model, opt, rank)
        watched = full_state(model)
        result["clean"] = [{"code": f.code, "severity": str(f.severity), "message": f.message} for f in session.findings]
        result["saves"], result["writes"] = session.tracer.saves, session.tracer.writes
        result["identical_to_plain"] = all(torch.equal(a, b) for a, b in zip(plain, watched))

        model, opt = build(buggy=True)
        try:
            with ipd.watch(model) as broken:
                train(model, opt, rank)
            result["raised"] = None
        except ipd.InplaceError as e:
            result["raised"] = str(e).splitlines()[0]
        result["broken"] = [
            {
                "code": f.code,
                "confirmed": f.confirmed,
                "mutation": f.mutation.location,
                "mutation_module": f.mutation.module,
                "saved": f.saved.location if f.saved else None,
            }
            for f in broken.findings
        ]
        gathered = ipd.gather(broken.report())
        result["gathered"] = None if gathered is None else [
            {"code": f.code, "ranks": list(f.ranks) or None} for f in gathered.findings
        ]
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)
        dist.destroy_process_group()
