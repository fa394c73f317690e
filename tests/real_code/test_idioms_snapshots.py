"""Correct programs around snapshots and asked-for writes stay silent under `watch()` (issue 25, items 3 and 5).

- An EMA that keeps its source's `state_dict()` as a live view and reads it by arithmetic into
  its own weights every step (BigGAN-PyTorch's `ema` class, written with `.data` as there and
  with `mul_`/`add_`): the view is meant to track the live weights; nothing, not even info.
- The "best weights" kept with `copy.deepcopy(model.state_dict())`, as PyTorch's
  transfer-learning tutorial does since pytorch/tutorials#188, restored with `load_state_dict`
  and written with `torch.save`: real snapshots.
- `transforms.Normalize(..., inplace=True)` applied to the tensor `ToTensor()` has just made, in
  a `Dataset.__getitem__` read through a `DataLoader` (StyleGAN2-ADA's training loader does
  this): the caller asked for the write and no one else holds the tensor.

"Silent" means no finding of any severity of the rules involved and no warning or error at
all; each program also runs plain from the same seeds, and the watched run must leave
parameters, buffers and results bit-identical.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

import inplace_doctor as ipd
from inplace_doctor import Severity


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def plain_and_watched(program: Callable[[], dict[str, torch.Tensor]], codes: set[str]) -> ipd.watch:
    """Run `program` plain, then under watch() from the same seed: same results bit for bit, and no
    finding of `codes` (any severity) nor any warning or error."""
    torch.manual_seed(0)
    plain = program()
    torch.manual_seed(0)
    session = ipd.watch()
    with session:
        watched = program()
    noisy = [f for f in session.findings if f.code in codes or f.severity in (Severity.ERROR, Severity.WARNING)]
    assert not noisy, "\n\n".join(f"{f.code} {f.severity}: {f.message}" for f in noisy)
    assert plain.keys() == watched.keys()
    assert [k for k in plain if not torch.equal(plain[k], watched[k])] == []
    return session


def state_of(*modules: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v.detach().clone() for i, m in enumerate(modules) for k, v in m.state_dict().items()}


# -- an EMA reading its source's live state dict ----------------------------------------------------


class BigGANStyleEMA:
    """BigGAN-PyTorch utils.ema: both dicts taken once, at construction; `update` each step."""

    def __init__(self, source: nn.Module, target: nn.Module, decay: float = 0.9, start_itr: int = 1) -> None:
        self.source_dict = source.state_dict()
        self.target_dict = target.state_dict()
        self.decay, self.start_itr = decay, start_itr
        with torch.no_grad():
            for key in self.source_dict:
                self.target_dict[key].data.copy_(self.source_dict[key].data)

    def update(self, itr: int, form: str) -> None:
        decay = 0.0 if itr < self.start_itr else self.decay
        with torch.no_grad():
            for key in self.source_dict:
                if form == "data":  # as BigGAN writes it, every entry (num_batches_tracked too)
                    self.target_dict[key].data.copy_(
                        self.target_dict[key].data * decay + self.source_dict[key].data * (1 - decay)
                    )
                elif self.source_dict[key].is_floating_point():
                    self.target_dict[key].mul_(decay).add_(self.source_dict[key], alpha=1 - decay)
                else:  # a counter: the current value, copied out of the live view
                    self.target_dict[key].copy_(self.source_dict[key])


@pytest.mark.parametrize("form", ["data", "mul_add"])
def test_ema_reading_a_live_state_dict_is_silent(form):
    kept: list[BigGANStyleEMA] = []  # held past the end of the watched code, as a trainer object is

    def program() -> dict[str, torch.Tensor]:
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
        ema_model = copy.deepcopy(model)
        ema = BigGANStyleEMA(model, ema_model)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for itr in range(3):
            opt.zero_grad()
            F.mse_loss(model(torch.randn(6, 4)), torch.randn(6, 1)).backward()
            opt.step()
            ema.update(itr, form)
        out = ema_model.eval()(torch.randn(3, 4))
        kept.append(ema)
        return {"out": out.detach(), **state_of(model, ema_model)}

    plain_and_watched(program, {"IPD107"})


# -- "best weights" kept with copy.deepcopy(model.state_dict()) ------------------------------------


def test_best_weights_kept_with_deepcopy_are_silent():
    def program() -> dict[str, torch.Tensor]:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True), nn.Flatten(), nn.LazyLinear(2))
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        x, y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
        val_x, val_y = torch.randn(8, 3, 6, 6), torch.randint(0, 2, (8,))
        model(x)  # materialize the lazy layer before the first snapshot
        best_wts = copy.deepcopy(model.state_dict())
        best_acc = -1.0
        for _ in range(3):
            model.train()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                acc = float((model(val_x).argmax(1) == val_y).float().mean())
            if acc > best_acc:
                best_acc, best_wts = acc, copy.deepcopy(model.state_dict())
        buffer = io.BytesIO()
        torch.save({"model": best_wts, "acc": best_acc}, buffer)
        model.load_state_dict(best_wts)
        buffer.seek(0)
        reloaded = torch.load(buffer)["model"]
        return {**state_of(model), **{f"saved.{k}": v for k, v in reloaded.items()}}

    plain_and_watched(program, {"IPD107"})


# -- Normalize(inplace=True) on the tensor ToTensor() has just made --------------------------------


class ImageFolderLike(Dataset):
    """A dataset of PIL images whose transform ends in `Normalize(..., inplace=True)`."""

    def __init__(self, n: int = 6) -> None:
        rng = np.random.default_rng(0)
        self.images = [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(n)]
        self.labels = [i % 2 for i in range(n)]
        self.transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], inplace=True)]
        )

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[i]), self.labels[i]


def test_normalize_inplace_on_a_fresh_tensor_in_a_dataloader_loop_is_silent():
    def program() -> dict[str, Any]:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.Flatten(), nn.Linear(144, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            for images, labels in DataLoader(ImageFolderLike(), batch_size=3, shuffle=True):
                opt.zero_grad()
                F.cross_entropy(model(images), labels).backward()
                opt.step()
        single = ImageFolderLike()[0][0]  # one sample, read after the transform as its result
        return {"single_mean": single.mean(), **state_of(model)}

    session = plain_and_watched(program, {"IPD106"})
    assert session.tracer.writes > 0


def test_normalize_inplace_on_a_tensor_the_caller_reads_again_is_reported_at_the_read():
    """The same transform on a tensor the caller keeps as the original image, inside a module that
    returns a new tensor: the caller's read of its own tensor after the call is the hazard."""

    class Preprocess(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.normalize = transforms.Normalize([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], inplace=True)

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return self.normalize(image).unsqueeze(0)

    image = transforms.ToTensor()(ImageFolderLike().images[0])
    with ipd.watch() as session:
        Preprocess()(image)
        shown = image.clamp(0, 1)  # <read>
    findings = [f for f in session.findings if f.code == "IPD106"]
    assert findings and all(f.severity is Severity.WARNING for f in findings)
    read_line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith("# <read>"))
    assert {(f.read.line, f.read.op) for f in findings} == {(read_line, "aten.clamp")}
    assert {f.mutation.op for f in findings} <= {"aten.sub_", "aten.div_"}
    assert float(shown.min()) == 0.0  # the "original" image now holds normalized values, clamped
