"""`ipd.memory` on the CUDA allocator: its 512-byte blocks, its own peaks beside ours, byte-exact with
MemTracker there too, and nothing left allocated or drawn afterwards."""

from __future__ import annotations

import gc

import pytest
import torch
from _cpu_tests import load

import inplace_doctor as ipd

memory_tests = load("engines/test_memory.py")

pytestmark = pytest.mark.cuda
SGD = memory_tests.OPTIMIZERS["sgd_momentum"]


def _blocks(t: torch.Tensor) -> int:
    """Bytes the caching allocator hands out for `t`: its size rounded up to 512-byte blocks."""
    return -(-t.numel() * t.element_size() // 512) * 512


def _mlp_on_cuda() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return memory_tests._mlp().cuda(), torch.randn(8, 32, device="cuda")


def test_memory_on_cuda_leaves_nothing_allocated_and_the_cuda_generator_as_found() -> None:
    model, x = _mlp_on_cuda()
    ipd.memory(model, x, optimizer=SGD)  # once first: cuBLAS workspaces and the like stay for the process
    gc.collect()
    allocated, generator = torch.cuda.memory_allocated(), torch.cuda.get_rng_state()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ipd.memory(model, x, optimizer=SGD)  # its Dropout draws from the CUDA generator, on the copies
    gc.collect()
    assert torch.cuda.memory_allocated() == allocated
    assert torch.equal(torch.cuda.get_rng_state(), generator)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_memory_on_cuda_counts_the_allocators_blocks_and_reports_its_peaks() -> None:
    model, x = _mlp_on_cuda()
    report = ipd.memory(model, x, optimizer=SGD)
    assert report.device == "cuda:0" and set(report.peaks) == {"forward", "backward", "optimizer"}
    parameters = sum(_blocks(p) for p in model.parameters())
    for phase, peak in report.peaks.items():
        # The allocator sees at least what the ledger counts (and whatever else lives on the device).
        assert peak.allocator_peak is not None and peak.allocator_peak >= peak.nbytes, phase
        assert sum(peak.by_category.values()) == peak.nbytes, phase
        assert peak.by_category["parameters"] == parameters, phase
        assert peak.by_category["optimizer state"] == parameters, phase  # one momentum buffer each
        assert peak.by_category["inputs"] == _blocks(x), phase
    assert "CUDA allocator peak in this phase" in str(report)


def test_memory_on_cuda_is_byte_exact_with_memtracker() -> None:
    """Last in this file: MemTracker keeps the models it tracked reachable for a while (test_memory.py)."""
    model, x = _mlp_on_cuda()
    torch.manual_seed(1)
    ours = ipd.memory(model, x, optimizer=SGD, steps=2).peak
    torch.manual_seed(1)
    assert ours == memory_tests._memtracker_peak(model, SGD, x, steps=2)
