"""One rank of the 2-process DDP test in test_idioms.py (not a test module itself).

`run(rank, world, port, result_dir)` is the target the test starts in each process (forked,
so torch is not imported again); `python _ddp_worker.py RANK WORLD PORT RESULT_DIR [BACKEND]` runs one
rank standalone (tests/cuda: NCCL, world size 1, each rank's tensors on its GPU). Trains a small
conv net with BatchNorm (so DDP
broadcasts buffers every forward) and ReLU(inplace=True) for 2 steps of 2 micro-batches (the
first under `no_sync()`), without watch(), inside watch(), and with DDP itself built inside
watch(), all from the same seeds, and writes the findings and a comparison to
RESULT_DIR/rank{RANK}.json. `check(results)` is what the ranks' results must show, for any world size.
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


class _BufferUser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)
        self.register_buffer("buf", torch.ones(1, 8))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (self.lin(z) * self.buf).sum()


def _buffer_module() -> nn.Module:
    return _BufferUser()


def _bn_module() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2))


def _call_twice_then_backward(ddp: DDP, which: str) -> None:
    if which == "22095":
        a = ddp(torch.randn(4, 16))
        b = ddp(torch.randn(4, 16))
        (a + b).backward()
    else:
        x1 = torch.randn(2, 2, 3, 4)
        out = ddp(x1).sum()
        ddp(torch.randn(2, 2, 3, 4))  # the extra forward after the one backward needs
        out.backward()


def state(model: DDP) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    out.update({f"{k}.grad": p.grad.detach().clone() for k, p in model.module.named_parameters()})
    return out


def run(rank: int, world: int, port: int, result_dir: str, backend: str = "gloo") -> None:
    """Rank `rank`'s whole job; writes `result_dir/rank{rank}.json`. Usable as a
    `torch.multiprocessing.start_processes` target (its first argument is the rank)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
        WORLD_SIZE=str(world), RANK=str(rank),
    )
    result: dict = {"rank": rank, "error": None, "findings": []}
    torch.set_num_threads(1)
    if backend == "nccl":  # every tensor of this job on the rank's GPU
        torch.cuda.set_device(rank)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False  # runs comparable bit for bit
        torch.set_default_device(f"cuda:{rank}")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=30))
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

        # Historic reports: a DDP module using a buffer (pytorch/pytorch#22095) or a BatchNorm
        # (#65907) called twice before backward raised an in-place error, because the buffer
        # broadcast at each forward bumped versions. Plain and watched, on this torch:
        result["historic"] = {}
        for name, make in (("22095", _buffer_module), ("65907", _bn_module)):
            for watched_run in (False, True):
                torch.manual_seed(0)
                ddp = DDP(make())
                try:
                    if watched_run:
                        with ipd.watch(ddp) as s:
                            _call_twice_then_backward(ddp, name)
                        outcome = [f.code for f in s.findings]
                    else:
                        _call_twice_then_backward(ddp, name)
                        outcome = []
                except Exception as e:  # recorded, the test says which
                    outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                result["historic"][f"{name}{' watched' if watched_run else ''}"] = outcome

        # A deliberate hazard inside a DDP model, forward only (no backward starts, so no
        # all-reduce is left pending): the graph is still alive when watch() ends, so the
        # write is reported as a prediction backward never reached (info); gathered on rank 0.
        torch.manual_seed(0)
        bad = DDP(nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.ReLU(inplace=True), nn.Linear(4, 1)))
        with ipd.watch(bad) as hazard:
            kept = bad(torch.randn(2, 4)).sum()
        report = hazard.report()
        result["hazard_severity"] = [str(f.severity) for f in report.findings]
        del kept
        result["hazard_rank"] = report.rank
        gathered = ipd.gather(report)
        result["gathered"] = None if gathered is None else [
            {
                "code": f.code,
                "ranks": list(f.ranks) or None,
                "mutation": f.mutation.module,
                "saved": f.saved.module if f.saved else None,
                "slot": f.details.get("slot"),
            }
            for f in gathered.findings
        ]
        dist.barrier()
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        dist.destroy_process_group()
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)


def check(results: list[dict]) -> None:
    """What every rank's result must show (`results[rank]`, read from `rank{rank}.json`)."""
    world = len(results)
    for rank, res in enumerate(results):
        assert res["rank"] == rank
        assert res["error"] is None, res["error"]
        bad = [f for f in res["findings"] if f["severity"] in ("error", "warning")]
        assert not bad, f"rank {rank}: " + "\n".join(f["message"] for f in bad)
        assert res["saves"] > 0 and res["writes"] > 0  # the tracer did see the training
        assert res["identical_to_plain"], f"rank {rank}: watched run differs from the plain one: {res['differ']}"
    # DDP kept the replicas in sync.
    assert all(res["checksum"] == results[0]["checksum"] for res in results)
    # pytorch/pytorch#22095 and #65907 (two forwards of a DDP module with buffers before
    # backward) no longer raise on this torch, plain or watched, and nothing is misreported.
    for res in results:
        assert res["historic"] == {"22095": [], "22095 watched": [], "65907": [], "65907 watched": []}
    # The planted hazard: each rank's report carries its rank; rank 0 gathered them all.
    assert [res["hazard_rank"] for res in results] == list(range(world))
    assert [res["hazard_severity"] for res in results] == [["info"]] * world
    assert all(res["gathered"] is None for res in results[1:])
    assert results[0]["gathered"] == [
        {"code": "IPD101", "ranks": list(range(world)), "mutation": "module.2", "saved": "module.1",
         "slot": "SigmoidBackward0.result"}
    ]


if __name__ == "__main__":  # python _ddp_worker.py RANK WORLD PORT RESULT_DIR [BACKEND]
    run(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:6])
