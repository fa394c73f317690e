"""Writes autograd does not record into graph tensors (IPD110), in the shapes real code has them.

- Tacotron 2's attention masks its alignment energies through `.data` with `-inf` before a softmax:
  the gradient reaching the masked positions is exactly 0, so the gradients equal the out-of-place
  program's. Silent, counted as harmless (`predictions_harmless`), bit-identical to the plain run.
- The same `.data` mask with 0 before a linear layer: the masked positions do get gradient (as if
  unmasked), so the prediction is confirmed, naming the write and the use.
- TSM's in-place temporal shift (a custom `autograd.Function` shifting channels through `.data`)
  wrapped around a residual block's first conv: the Function's own output and the conv it feeds are
  the Function's business (its backward shifts the gradient back); the use is the residual
  `out += identity`, which reads the shifted values as if they were the block's input.
- An in-place custom Function that declares its write (`ctx.mark_dirty`) is correct: silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_idioms import (
    one_thread,  # noqa: F401  (its autouse fixture, for these tests too)
    serious,
    twin,
)
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import Severity

HERE = Path(__file__).resolve()


def line_of(tag: str) -> int:
    """The line of this file carrying the comment `# <<tag>>` (exactly one)."""
    needle = "# <<" + tag + ">>"
    lines = [i for i, text in enumerate(HERE.read_text().splitlines(), 1) if text.rstrip().endswith(needle)]
    assert len(lines) == 1, (tag, lines)
    return lines[0]


# -- Tacotron 2 (NVIDIA/tacotron2, model.py: Attention.forward) ------------------------------------


class Attention(nn.Module):
    def __init__(self, rnn_dim: int = 12, embedding_dim: int = 10, attention_dim: int = 8) -> None:
        super().__init__()
        self.query_layer = nn.Linear(rnn_dim, attention_dim, bias=False)
        self.memory_layer = nn.Linear(embedding_dim, attention_dim, bias=False)
        self.v = nn.Linear(attention_dim, 1, bias=False)
        self.score_mask_value = -float("inf")

    def get_alignment_energies(self, query: torch.Tensor, processed_memory: torch.Tensor) -> torch.Tensor:
        processed_query = self.query_layer(query.unsqueeze(1))
        energies = self.v(torch.tanh(processed_query + processed_memory))
        return energies.squeeze(-1)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        alignment = self.get_alignment_energies(query, self.memory_layer(memory))
        if mask is not None:
            alignment.data.masked_fill_(mask, self.score_mask_value)  # <<tacotron-write>>
        attention_weights = F.softmax(alignment, dim=1)
        return torch.bmm(attention_weights.unsqueeze(1), memory).squeeze(1)


class OutOfPlaceAttention(Attention):
    """The same attention with the mask recorded by autograd: the program the user meant."""

    def forward(self, query: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        alignment = self.get_alignment_energies(query, self.memory_layer(memory))
        if mask is not None:
            alignment = alignment.masked_fill(mask, self.score_mask_value)
        attention_weights = F.softmax(alignment, dim=1)
        return torch.bmm(attention_weights.unsqueeze(1), memory).squeeze(1)


def _decoder(attention_type: type[Attention]) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    attention, cell = attention_type(), nn.GRUCell(10, 12)
    opt = torch.optim.SGD([*attention.parameters(), *cell.parameters()], lr=0.1)
    return attention, cell, opt


def _train_decoder(objs: tuple[nn.Module, nn.Module, torch.optim.Optimizer], steps: int = 3) -> None:
    attention, cell, opt = objs
    lengths = torch.tensor([6, 4, 5])
    mask = torch.arange(6)[None, :] >= lengths[:, None]  # padding of each utterance
    for _ in range(steps):
        memory = torch.randn(3, 6, 10)
        hidden = torch.zeros(3, 12)
        loss = torch.zeros(())
        for _ in range(3):  # decoder steps
            context = attention(hidden, memory, mask)
            hidden = cell(context, hidden)
            loss = loss + hidden.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_tacotron_mask_through_data_before_softmax_is_silent_and_counted_harmless() -> None:
    session, _, _ = twin(lambda: _decoder(Attention), _train_decoder, lambda objs: objs[:2])
    assert session.findings == [] or not serious(session.findings)
    assert session.report().stats["predictions_harmless"] == 9  # 3 steps x 3 decoder steps


def test_tacotron_mask_through_data_computes_the_out_of_place_gradients() -> None:
    """The PyTorch fact the silence rests on: bit-identical to `alignment.masked_fill(mask, -inf)`."""
    results = []
    for attention_type in (Attention, OutOfPlaceAttention):
        torch.manual_seed(0)
        objs = _decoder(attention_type)
        torch.manual_seed(1)
        _train_decoder(objs)
        results.append([p.detach().clone() for m in objs[:2] for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_data_mask_with_zero_before_a_linear_layer_is_confirmed() -> None:
    torch.manual_seed(0)
    encoder, head = nn.Linear(8, 8), nn.Linear(8, 1)
    x = torch.randn(4, 8)
    mask = torch.zeros(4, 8, dtype=torch.bool)
    mask[:, 5:] = True
    with ipd.watch() as session:
        h = encoder(x)
        h.data.masked_fill_(mask, 0.0)  # <<zero-write>>
        head(h).sum().backward()  # <<zero-use>>
    (f,) = [f for f in session.findings if f.code == "IPD110"]
    assert f.confirmed is True and f.severity is Severity.WARNING
    assert (f.mutation.line, f.read.line) == (line_of("zero-write"), line_of("zero-use"))
    assert "predictions_harmless" not in session.report().stats


def test_a_data_mask_whose_positions_the_softmax_does_not_zero_is_confirmed() -> None:
    """A finite mask value before softmax: the masked positions keep a weight, and gradient."""
    torch.manual_seed(0)
    proj = nn.Linear(6, 6)
    mask = torch.tensor([[False, False, True], [False, True, True]])
    with ipd.watch() as session:
        scores = proj(torch.randn(2, 6))[:, :3]
        scores.data.masked_fill_(mask, -10.0)
        F.softmax(scores, dim=1)[:, 0].sum().backward()
    (f,) = [f for f in session.findings if f.code == "IPD110"]
    assert f.confirmed is True


def _write_masked(form: str, scores: torch.Tensor, value: float) -> None:
    """Positions 3 and 4 of each row set to `value`, written where autograd does not record it."""
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    mask[:, 3:] = True
    if form == "data":
        scores.data.masked_fill_(mask, value)
    elif form == "detach-index":
        scores.detach()[mask] = value
    elif form == "no_grad":
        with torch.no_grad():
            scores.masked_fill_(mask, value)
    elif form == "data-slice":
        scores.data[:, 3:].fill_(value)
    else:  # integer index
        scores.detach()[:, torch.tensor([3, 4])] = value


@pytest.mark.parametrize("form", ["data", "detach-index", "no_grad", "data-slice", "integer-index"])
@pytest.mark.parametrize("value", [-float("inf"), 0.0])
def test_the_written_positions_decide_in_every_form_of_the_write(form: str, value: float) -> None:
    """`scores` is a strided view of a linear layer's output: the positions are mapped onto it."""
    torch.manual_seed(0)
    proj = nn.Linear(8, 8)
    with ipd.watch() as session:
        scores = proj(torch.randn(2, 5, 8))[..., 0]
        _write_masked(form, scores, value)
        (F.softmax(scores, dim=-1) * torch.arange(5.0)).sum().backward()
    hits = [f for f in session.findings if f.code == "IPD110"]
    if value == -float("inf"):  # softmax's output, and so the gradient, is exactly 0 there
        assert hits == [] and session.report().stats["predictions_harmless"] == 1
    else:
        (f,) = hits
        assert f.confirmed is True and f.facts.nonzero_gradient == 4 and f.facts.written == 4


# -- TSM (mit-han-lab/temporal-shift-module, ops/temporal_shift.py) --------------------------------


class InplaceShift(torch.autograd.Function):
    # Special thanks to @raoyongming for the help to this function
    @staticmethod
    def forward(ctx, input, fold):  # type: ignore[override]
        ctx.fold_ = fold
        n, t, c, h, w = input.size()
        buffer = input.data.new(n, t, fold, h, w).zero_()
        buffer[:, :-1] = input.data[:, 1:, :fold]
        input.data[:, :, :fold] = buffer  # <<shift-left>>
        buffer.zero_()
        buffer[:, 1:] = input.data[:, :-1, fold: 2 * fold]
        input.data[:, :, fold: 2 * fold] = buffer  # <<shift-right>>
        return input

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        fold = ctx.fold_
        n, t, c, h, w = grad_output.size()
        buffer = grad_output.data.new(n, t, fold, h, w).zero_()
        buffer[:, 1:] = grad_output.data[:, :-1, :fold]
        grad_output.data[:, :, :fold] = buffer
        buffer.zero_()
        buffer[:, :-1] = grad_output.data[:, 1:, fold: 2 * fold]
        grad_output.data[:, :, fold: 2 * fold] = buffer
        return grad_output, None


class TemporalShift(nn.Module):
    def __init__(self, net: nn.Module, n_segment: int = 4, n_div: int = 4) -> None:
        super().__init__()
        self.net, self.n_segment, self.fold_div = net, n_segment, n_div

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nt, c, h, w = x.size()
        n_batch = nt // self.n_segment
        x = x.view(n_batch, self.n_segment, c, h, w)
        out = InplaceShift.apply(x, c // self.fold_div)
        return self.net(out.view(nt, c, h, w))


class BasicBlock(nn.Module):
    def __init__(self, planes: int = 8) -> None:
        super().__init__()
        self.conv1 = TemporalShift(nn.Conv2d(planes, planes, 3, padding=1, bias=False))
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity  # <<residual>>
        return self.relu(out)


def test_tsm_inplace_shift_names_the_residual_as_the_use() -> None:
    torch.manual_seed(0)
    stem, block = nn.Conv2d(3, 8, 3, padding=1), BasicBlock()
    with ipd.watch() as session:
        block(stem(torch.randn(8, 3, 6, 6))).mean().backward()
    hits = [f for f in session.findings if f.code == "IPD110"]
    assert hits, [(f.code, f.message) for f in session.findings]
    assert {f.mutation.line for f in hits} <= {line_of("shift-left"), line_of("shift-right")}
    for f in hits:
        assert f.read is not None and f.read.file == str(HERE), f.read
        assert (f.read.line, f.read.op) == (line_of("residual"), "aten.add_")
        assert f.confirmed is True


class ScaleInPlace(torch.autograd.Function):
    """An in-place Function that tells autograd what it wrote (as InPlace-ABN does)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad * 2


def test_an_inplace_function_that_marks_its_write_dirty_is_silent() -> None:
    def build() -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
        a, b = nn.Linear(6, 6), nn.Linear(6, 2)
        return a, b, torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)

    def train(objs: tuple[nn.Module, nn.Module, torch.optim.Optimizer]) -> None:
        a, b, opt = objs
        for _ in range(2):
            h = ScaleInPlace.apply(a(torch.randn(3, 6)))
            loss = b(h).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    twin(build, train, lambda objs: objs[:2])


def test_the_gradient_check_changes_no_gradient_and_keeps_no_tensor_alive() -> None:
    import gc
    import weakref

    def step(watched: bool, value: float) -> tuple[torch.Tensor, weakref.ref[torch.Tensor]]:
        torch.manual_seed(0)
        proj = nn.Linear(8, 8)
        session = ipd.watch() if watched else None
        if session is not None:
            session.__enter__()
        scores = proj(torch.randn(2, 5, 8))[..., 0]
        root = weakref.ref(scores._base)
        _write_masked("data", scores, value)
        loss = (F.softmax(scores, dim=-1) * torch.arange(5.0)).sum()
        loss.backward()
        del scores, loss
        if session is not None:
            session.__exit__(None, None, None)
        gc.collect()
        assert proj.weight.grad is not None
        return proj.weight.grad, root

    for value in (-float("inf"), 0.0):
        plain, _ = step(False, value)
        watched, root = step(True, value)
        assert torch.equal(plain, watched) and root() is None
