# mypy: ignore-errors
"""Out-of-place ops call cudaMalloc/cudaMemcpy/cudaFree each time and force a stream sync (GPU-only claim)."""

import torch

CLAIM = "every out-of-place op costs cudaMalloc + cudaMemcpy + cudaFree and a cudaStreamSynchronize"
SOURCE = "seed 000"
GPU = True


def run() -> tuple[str, str]:
    # Ready for a GPU: count device allocations the caching allocator makes for 100 out-of-place ReLUs.
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["num_device_alloc"]
    for _ in range(100):
        x = torch.relu(x)
    torch.cuda.synchronize()
    allocs = torch.cuda.memory_stats()["num_device_alloc"] - before
    return (f"device allocations for 100 out-of-place ReLUs: {allocs}", "FALSE" if allocs < 10 else "TRUE")
