"""FSDP2 (`torch.distributed.fsdp.fully_shard`) in a 2-process gloo job on CPU, under watch() and run.

No finding comes from FSDP2's own parameter management (why each of its writes is harmless is
in `_fsdp_worker.py`), training is bit-identical with and without the tool, and a real bug in a
sharded block's forward is found on every rank, with both lines, and gathered by `ipd.gather`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import line_of

HERE = Path(__file__).parent
WORKER = HERE / "_fsdp_worker.py"

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable"),
    pytest.mark.skipif(sys.platform != "linux", reason="forks the test process (fast: no second torch import)"),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_worker():
    spec = importlib.util.spec_from_file_location("_ipd_fsdp_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fully_shard_two_process_gloo_is_clean_and_a_planted_bug_is_found_on_every_rank(tmp_path: Path) -> None:
    if not torch.distributed.is_gloo_available():
        pytest.skip("gloo backend unavailable")
    worker = _load_worker()
    world = 2
    importlib.import_module("torch._dynamo")  # imported by FSDP2 on first use: once, here, not per rank
    importlib.import_module("torch.distributed.fsdp")
    ctx = torch.multiprocessing.start_processes(
        worker.run, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=False, start_method="fork"
    )
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail("FSDP2 ranks did not finish within 120 s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)

    write = f"_fsdp_worker.py:{line_of(WORKER, 'h.mul_(2)')}"
    save = f"_fsdp_worker.py:{line_of(WORKER, 'h = self.gate(self.fc(x))')}"
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]
    for rank, res in enumerate(results):
        assert res["error"] is None, res["error"]
        assert res["clean"] == [], f"rank {rank}: FSDP2's own writes reported: {res['clean']}"
        assert res["saves"] > 0 and res["writes"] > 0  # the tracer did see the sharded training
        assert res["identical_to_plain"], f"rank {rank}: the watched run trained differently"
        assert res["raised"] is not None and "overwrote" in res["raised"]
        [finding] = res["broken"]
        assert finding["code"] == "IPD101" and finding["confirmed"] is True
        assert finding["mutation"].endswith(write) and finding["saved"].endswith(save)
        assert finding["mutation_module"] == "1"  # the block as the user indexed it: model.1
    assert results[1]["gathered"] is None
    assert results[0]["gathered"] == [{"code": "IPD101", "ranks": [0, 1]}]


SCRIPT = textwrap.dedent(
    """\
    import os
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    sys.path.insert(0, sys.argv[1])
    import _fsdp_worker as w

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    model, opt = w.build(buggy="--bug" in sys.argv)
    w.train(model, opt, dist.get_rank())
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("bug", [False, True], ids=["clean", "bug"])
def test_inplace_doctor_run_on_each_rank_of_a_fully_shard_job(tmp_path: Path, bug: bool) -> None:
    if not torch.distributed.is_gloo_available():
        pytest.skip("gloo backend unavailable")
    script = tmp_path / "train_fsdp.py"
    script.write_text(SCRIPT)
    port, world = _free_port(), 2
    procs = []
    for rank in range(world):
        env = {
            **os.environ, "NO_COLOR": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo", "RANK": str(rank), "WORLD_SIZE": str(world),
        }
        argv = [sys.executable, "-m", "inplace_doctor", "run", "--format", "json",
                "--output", str(tmp_path / f"rank{rank}.json"), str(script), str(HERE)]
        procs.append(subprocess.Popen(argv + (["--bug"] if bug else []), env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["rank"] == rank
        codes = [f["code"] for f in report["findings"]]
        if bug:
            assert p.returncode == 1, err
            assert codes == ["IPD101"], err
            [f] = report["findings"]
            assert f["mutation"]["line"] == line_of(WORKER, "h.mul_(2)")
            assert f["saved"]["line"] == line_of(WORKER, "h = self.gate(self.fc(x))")
        else:
            assert p.returncode == 0, err
            assert codes == [], err
