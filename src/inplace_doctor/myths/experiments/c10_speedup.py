# mypy: ignore-errors
"""inplace=True speeds training up by 8-12 % (ResNet-50: 9.2 %): a GPU timing claim."""

import time

import torch
import torchvision

CLAIM = "inplace=True gives +8-12 % training speed (9.2 % on ResNet-50)"
SOURCE = "seed 000"
GPU = True


def run() -> tuple[str, str]:
    # Ready for a GPU: ResNet-50 train steps, every ReLU in place vs none, interleaved, median ratio.
    def model(inplace: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        m = torchvision.models.resnet50(weights=None).cuda()
        for mod in m.modules():
            if isinstance(mod, torch.nn.ReLU):
                mod.inplace = inplace
        return m

    x = torch.randn(32, 3, 224, 224, device="cuda")
    models = {True: model(True), False: model(False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(25):
        for flag, m in models.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            m(x).sum().backward()
            torch.cuda.synchronize()
            if r >= 5:
                times[flag].append(time.perf_counter() - t)
    ratio = sorted(times[False])[10] / sorted(times[True])[10]
    return (f"median step time out-of-place / in-place: {ratio:.3f}", "TRUE" if ratio >= 1.08 else "FALSE")
