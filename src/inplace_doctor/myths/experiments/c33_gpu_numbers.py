# mypy: ignore-errors
"""GPU-only figures (ViT 45 % memory, channels_last 22 %, fused kernels 15 %): ready for a GPU."""

import torch
import torchvision

import inplace_doctor as ipd

CLAIM = "in-place saves 45 % memory on ViT (GPU)"
SOURCE = "seed 000"
GPU = True


def run() -> tuple[str, str]:
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None).cuda()
    x = torch.randn(8, 3, 224, 224, device="cuda")
    report = ipd.memory(model, x, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4))
    sites = sum(1 for m in model.modules() if isinstance(m.__dict__.get("inplace"), bool))
    return (f"vit_b_16 has {sites} modules with an inplace option; training peak {report.peak:,} B "
            f"(CUDA allocator: {report.peak_phase.allocator_peak})", "FALSE" if sites == 0 else "PARTLY")
