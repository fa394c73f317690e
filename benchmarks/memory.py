"""Peak memory of a training step: every in-place flag off, as shipped, after `optimize`,
and with the suggested activation checkpointing — for torchvision's classification
models, a transformer encoder and a model with Dropout.

    . .venv/bin/activate && python benchmarks/memory.py                # every model; hours on a CPU
    python benchmarks/memory.py --models resnet18,mobilenet_v2          # a few
    python benchmarks/memory.py --max-params 60e6 --input 2x3x64x64     # skip the large ones
    python benchmarks/memory.py --jobs 2 --max-params 300e6              # two models at a time, one thread each

Prints a Markdown table (bytes, exact; measured by `ipd.memory`, one SGD-momentum
step after one warm-up step, train mode, random weights). It asserts nothing.
Models above --max-params (default: no limit) are listed as skipped, not dropped silently;
a model whose process dies (out of memory) is listed with the error.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torchvision
from _torchvision_sizes import classification_size  # benchmarks/ is on sys.path when run as a script
from torch import nn

import inplace_doctor as ipd
from inplace_doctor.engines.optimize.toml_config import inplace_modules


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(256, 1024), nn.ReLU(), nn.Dropout(0.2, inplace=True),
            nn.Linear(1024, 1024), nn.ReLU(inplace=True), nn.Dropout(0.2),
            nn.Linear(1024, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def all_off(model: nn.Module) -> nn.Module:
    model = copy.deepcopy(model)
    for m in inplace_modules(model).values():
        m.inplace = False
    return model


def measure(name: str, model: nn.Module, x: torch.Tensor) -> str:
    model.train()
    start = time.perf_counter()
    def peak(m: nn.Module) -> int | str:
        try:
            return ipd.memory(m, x, optimizer=sgd).peak
        except RuntimeError as e:  # the in-place configuration breaks backward
            return "raises: " + str(e).splitlines()[0][:60]

    off, shipped = peak(all_off(model)), peak(model)
    try:
        plan = ipd.optimize(model, x, optimizer=sgd, checkpoint_min_share=0.0)  # measured whatever it saves
    except Exception as e:  # reported, never hidden
        return f"| {name} | error in optimize: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | | | | | |"
    sites = len(inplace_modules(model))
    cp = plan.checkpoint
    cp_cell = f"{cp.peak_after:,} ({cp.module})" if cp else "-"
    verified = "yes" if plan.verified else "no"
    def cell(v: int | str) -> str:
        return f"{v:,}" if isinstance(v, int) else v

    saves = cell(off - shipped) if isinstance(off, int) and isinstance(shipped, int) else "-"
    return (
        f"| {name} | {sites} | {cell(off)} | {cell(shipped)} | {plan.peak_planned:,} | {cp_cell} | "
        f"{saves} | {verified} | {time.perf_counter() - start:.0f} s |"
    )


def _num_params(name: str) -> int:
    """From the builder's published weights metadata (no model is built: some builders
    allocate real memory even under the meta device), else counted on the meta device."""
    try:
        return int(next(iter(torchvision.models.get_model_weights(name))).meta["num_params"])
    except Exception:
        with torch.device("meta"):
            return sum(p.numel() for p in torchvision.models.get_model(name, weights=None).parameters())


def measure_builder(name: str, shape: tuple[int, ...], max_params: float) -> None:
    """Print the row of one torchvision builder (run in a child process by main)."""
    size = _num_params(name)
    if size > max_params:
        print(f"| {name} | skipped: {size / 1e6:.0f} M parameters > --max-params | | | | | | | |")
        return
    torch.manual_seed(0)
    h = classification_size(name, shape[-1])
    x = torch.randn(*shape[:-2], max(h, shape[-2]), max(h, shape[-1]))
    model = torchvision.models.get_model(name, weights=None)
    if name in ("inception_v3", "googlenet"):
        model.aux_logits = False
        if name == "inception_v3":
            model.AuxLogits = None
        else:
            model.aux1 = model.aux2 = None
    print(measure(name, model, x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated torchvision builder names (default: every classification model)")
    parser.add_argument("--skip", default="", help="comma-separated builder names already measured (resume by hand)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one builder in this process
    parser.add_argument("--input", default="2x3x64x64", help="input shape for the image models")
    parser.add_argument("--max-params", type=float, default=float("inf"),
                        help="skip larger models (from the weights' metadata; default: no limit)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="models measured at once, each in its own process (default 1; mind the memory: "
                             "the largest models need about 8 times their parameters' bytes)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (default: cores / jobs)")
    ns = parser.parse_args()
    threads = ns.threads or max(1, (os.cpu_count() or 1) // max(1, ns.jobs))
    torch.set_num_threads(threads)
    shape = tuple(int(d) for d in ns.input.split("x"))
    names = ns.models.split(",") if ns.models else torchvision.models.list_models(module=torchvision.models)
    names = [n for n in names if n not in set(ns.skip.split(","))]
    if ns.one:
        measure_builder(ns.one, shape, ns.max_params)
        return
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, inplace-doctor {ipd.__version__}")
    print()
    print("| model | inplace sites | all off (B) | as shipped (B) | after optimize (B) | checkpointing the largest holder (B) | in-place saves (B) | verified | time |")
    print("|---|--:|--:|--:|--:|--:|--:|---|--:|")
    sys.stdout.flush()

    def row(name: str) -> str:
        # Each model in its own process: a model that exhausts memory is reported, not fatal.
        cmd = [sys.executable, __file__, "--one", name, "--input", ns.input, "--max-params", str(ns.max_params),
               "--threads", str(threads)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
        if done.returncode != 0 or not rows:
            why = "killed (out of memory?)" if done.returncode < 0 else (done.stderr.strip().splitlines() or ["?"])[-1][:100]
            return f"| {name} | error: {why} | | | | | | | |"
        return rows[-1]

    with ThreadPoolExecutor(max(1, ns.jobs)) as pool:
        for line in pool.map(row, names):  # in the order of `names`, each as soon as those before it are done
            print(line)
            sys.stdout.flush()
    torch.manual_seed(0)
    print(measure("TransformerEncoder 4x256 (dropout 0.1)", encoder(), torch.randn(8, 64, 256)))
    torch.manual_seed(0)
    print(measure("MLP with Dropout(inplace=True)", DropoutMLP(), torch.randn(512, 256)))


if __name__ == "__main__":
    main()
