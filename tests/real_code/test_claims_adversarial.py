"""Every error is a claim about what PyTorch will do: each claim checked against what PyTorch did.

Each case is a few lines of real torch. Its ground truth is measured, never assumed: the case runs
plainly (does backward raise PyTorch's "modified by an inplace operation"?) and as the program the
user meant (every saved tensor copied at save, `saved_tensors_hooks(clone)`: do the gradients
differ from the plain run's, a silently wrong result?), and the test first checks that truth is the
one the case names. Then it runs under `watch()` (the fast tracer) and `watch(deep=True)`:

- it computes what the plain run computes, bit for bit (the tool changes nothing it observes);
- RAISES: an IPD101 error confirmed by backward, naming the line that wrote (`# <write>`) and the
  one that saved (`# <saved>`), its sentence saying backward *raised*;
- SILENT: an error (IPD104, IPD109) confirmed by backward, naming the write;
- HARMLESS: no error and no warning (an unconfirmed info for a graph still alive when the session
  ended is allowed, worded as a condition: "will raise" only for "a backward that reaches" it);
- RAISES_AT_OP: PyTorch refuses the op itself: an IPD102/IPD103 error at the write.

The fix a raising case's finding carries is a claim too: it names only methods tensors have, never
replaces a call alone by its out-of-place form (which drops the write), and its edits, applied, run
without error and compute the meant program's gradients. Both tracers name the saving slot alike; a
write beside the saved elements is not said to overwrite them; a graph alive but never
backpropagated is an unconfirmed info; `audit` with a loss that does not reach the write likewise.

What tests/rules, tests/real_code/test_bug_reports*.py, test_correct_programs_adversarial.py and
tests/trace/test_stopped_backward.py cover is not repeated: these are the edges of what an op saves
(an operand that does not require grad, ops that save their output or nothing), which backward
reaches a node (`inputs=`, `retain_graph`, `create_graph`), where the write happens (no_grad,
inference mode, after backward, in a loop), and through which alias.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import inplace_doctor as ipd
from inplace_doctor import Severity

Grads = dict[str, torch.Tensor]


class Truth(enum.Enum):
    RAISES = "backward raises"
    SILENT = "silently wrong gradients"
    HARMLESS = "harmless"
    RAISES_AT_OP = "the op raises"


def _w(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


# ---------------------------------------------------------------------------
# the cases: each returns its leaves' gradients
# ---------------------------------------------------------------------------


def mul_operand_without_grad_is_not_saved() -> Grads:
    w, a = _w(4), torch.randn(4, dtype=torch.float64)
    h = w + 1
    y = h * a  # MulBackward0 saves `a` only: `h`'s partner needs no grad
    h.mul_(2)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def mul_saves_the_operand_without_grad() -> Grads:
    w, a = _w(4), torch.randn(4, dtype=torch.float64)
    h = w + 1
    y = h * a  # <saved>
    a.mul_(2)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def add_and_sub_save_nothing() -> Grads:
    w, v = _w(4), _w(4)
    h, g = w * 2, v * 3
    y = (h + g) - h
    h.add_(1)  # <write>
    g.sub_(1)
    y.sum().backward()
    return {"w": w.grad, "v": v.grad}


def matmul_with_a_constant_saves_only_the_constant() -> Grads:
    w, m = _w(3, 3), torch.randn(2, 3, dtype=torch.float64)
    h = w * 1
    y = m @ h
    h.zero_()  # <write>
    y.sum().backward()
    return {"w": w.grad}


def relu_input_is_not_saved() -> Grads:
    w = _w(5)
    h = w * 1
    r = torch.relu(h)
    h.mul_(-1)  # <write>
    r.sum().backward()
    return {"w": w.grad}


def relu_output_is_saved() -> Grads:
    w = _w(5)
    r = torch.relu(w * 1)  # <saved>
    r.mul_(2)  # <write>
    r.sum().backward()
    return {"w": w.grad}


def tanh_input_is_not_saved() -> Grads:
    w = _w(5)
    h = w * 1
    t = torch.tanh(h)
    h.add_(1)  # <write>
    t.sum().backward()
    return {"w": w.grad}


def exp_output_is_saved() -> Grads:
    w = _w(5)
    e = w.exp()  # <saved>
    e[1:3] = 0  # <write>
    (e * 2).sum().backward()
    return {"w": w.grad}


def pow_saves_its_input_not_its_output() -> Grads:
    w = _w(5)
    h = w * 1
    p = h.pow(3)
    p.add_(1)  # <write>
    p.sum().backward()
    return {"w": w.grad}


def pow_input_written() -> Grads:
    w = _w(5)
    h = w * 1
    p = h.pow(3)  # <saved>
    h.add_(1)  # <write>
    p.sum().backward()
    return {"w": w.grad}


def log_output_written() -> Grads:
    w = _w(5)
    lg = (w * w + 1).log()
    lg.mul_(3)  # <write>
    lg.sum().backward()
    return {"w": w.grad}


def div_by_a_constant_saves_only_the_divisor() -> Grads:
    w, c = _w(5), torch.rand(5, dtype=torch.float64) + 1
    h = w * 1
    q = h / c
    h.add_(1)  # <write>
    q.sum().backward()
    return {"w": w.grad}


def where_saves_only_its_condition() -> Grads:
    w = _w(5)
    h = w * 1
    y = torch.where(h > 0, h, torch.zeros_like(h))
    h.mul_(3)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def dropout_output_written() -> Grads:
    w = _w(6)
    d = F.dropout(w * 1, p=0.5, training=True)
    d.mul_(2)  # <write>
    d.sum().backward()
    return {"w": w.grad}


def backward_inputs_do_not_reach_the_node() -> Grads:
    w, v = _w(4), _w(4)
    s = torch.sigmoid(w * 1)
    loss = (s * 3).sum() + (v * 2).sum()
    s.mul_(2)  # <write>
    loss.backward(inputs=[v])
    return {"v": v.grad}


def autograd_grad_of_another_leaf() -> Grads:
    w, v = _w(4), _w(4)
    s = torch.sigmoid(w * 1)
    loss = (s * 3).sum() + (v * 2).sum()
    s.mul_(2)  # <write>
    (gv,) = torch.autograd.grad(loss, [v])
    return {"v": gv}


def backward_inputs_reach_the_node() -> Grads:
    w, v = _w(4), _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    loss = (s * 3).sum() + (v * 2).sum()
    s.mul_(2)  # <write>
    loss.backward(inputs=[w])
    return {"w": w.grad}


def second_backward_of_a_retained_graph() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    loss = (s * 3).sum()
    loss.backward(retain_graph=True)
    s.mul_(2)  # <write>
    loss.backward()
    return {"w": w.grad}


def write_after_backward() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)
    (s * 3).sum().backward()
    s.mul_(2)  # <write>
    return {"w": w.grad}


def double_backward_after_the_write() -> Grads:
    w = _w(4)
    h = w * 1
    y = (h**3).sum()
    (g,) = torch.autograd.grad(y, h, create_graph=True)  # <saved>
    h.mul_(2)  # <write>
    g.sum().backward()
    return {"w": w.grad}


def write_under_no_grad() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    with torch.no_grad():
        s.clamp_(max=0.6)  # <write>
    s.sum().backward()
    return {"w": w.grad}


def write_under_inference_mode() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    with torch.inference_mode():
        s.mul_(2)  # <write>
    s.sum().backward()
    return {"w": w.grad}


def write_to_a_view_of_the_saved_tensor() -> Grads:
    w = _w(3, 4)
    s = torch.tanh(w * 1)  # <saved>
    s[:, 0].zero_()  # <write>
    s.sum().backward()
    return {"w": w.grad}


def write_to_the_base_of_a_saved_view_outside_it() -> Grads:
    w = _w(3, 4)
    b = w * 1
    v = b[0]
    y = v.sin()  # <saved>
    b[2].zero_()  # <write>
    y.sum().backward()
    return {"w": w.grad}


def write_through_detach() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    s.detach().mul_(2)  # <write>
    s.sum().backward()
    return {"w": w.grad}


def write_through_data() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    s.data.mul_(2)  # <write>
    (s * 1).sum().backward()
    return {"w": w.grad}


def write_through_numpy() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    s.detach().numpy()[:] *= 2  # <write>
    (s * 1).sum().backward()
    return {"w": w.grad}


def data_write_to_an_unsaved_tensor() -> Grads:
    w = _w(4)
    h = w * 1
    y = h * 2
    h.data.mul_(2)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def checkpointed_input_written_after_the_region() -> Grads:
    from torch.utils.checkpoint import checkpoint

    w = _w(4)
    h = w * 1
    y = checkpoint(torch.sin, h, use_reentrant=False)  # <saved>
    h.add_(1)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def checkpointed_region_writes_its_own_output() -> Grads:
    from torch.utils.checkpoint import checkpoint

    def region(x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(x)
        return s.mul_(2)

    w = _w(4)
    y = checkpoint(region, w * 1, use_reentrant=False)
    y.sum().backward()
    return {"w": w.grad}


def autocast_saves_a_cast_copy() -> Grads:
    w, m = _w(4, 4), torch.randn(3, 4)
    h = (w * 1).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m @ h
    h.mul_(2)  # <write>
    y.float().sum().backward()
    return {"w": w.grad}


class _SaveInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * g


class _SaveOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return y * g


class _DoubleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 2 * g


def function_saves_its_input() -> Grads:
    w = _w(4)
    h = w * 1
    y = _SaveInput.apply(h)  # <saved>
    h.add_(1)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def function_saves_its_output() -> Grads:
    w = _w(4)
    y = _SaveOutput.apply(w * 1)  # <saved>
    y.add_(1)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def function_marks_its_input_dirty() -> Grads:
    w = _w(4)
    h = w * 1
    y = _DoubleInPlace.apply(h)  # <write>
    (y * 3).sum().backward()
    return {"w": w.grad}


def inplace_on_a_leaf_that_requires_grad() -> Grads:
    w = _w(4)
    w.add_(1)  # <write>
    return {"w": w}


def loop_writes_graphs_that_are_dropped() -> Grads:
    w = _w(4)
    for i in range(3):
        s = torch.sigmoid(w + i)
        if i < 2:
            s.mul_(2)  # <write>
    s.sum().backward()
    return {"w": w.grad}


def loop_writes_every_graph_only_the_last_backpropagated() -> Grads:
    w = _w(4)
    for i in range(3):
        s = torch.sigmoid(w + i)  # <saved>
        s.mul_(2)  # <write>
    s.sum().backward()
    return {"w": w.grad}


def write_that_changes_no_value() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    s.copy_(s.detach().clone())  # <write>
    s.sum().backward()
    return {"w": w.grad}


def inplace_op_saves_its_own_result() -> Grads:
    w = _w(4)
    h = w * 1
    h.exp_()  # <saved>
    h.mul_(2)  # <write>
    h.sum().backward()
    return {"w": w.grad}


def inplace_op_whose_result_is_not_saved() -> Grads:
    w = _w(4)
    h = w * 1
    h.mul_(2).exp_()
    h.sum().backward()
    return {"w": w.grad}


def mul_by_itself_in_place() -> Grads:
    w = _w(4)
    h = w * 1
    h.mul_(h)  # <write>
    h.sum().backward()
    return {"w": w.grad}


def mul_saves_both_only_one_needed() -> Grads:
    wa, wb = _w(4), _w(4)
    a, b = wa * 1, wb * 1
    y = a * b  # <saved>
    a.add_(1)  # <write>
    y.sum().backward(inputs=[wa])
    return {"wa": wa.grad}


def frozen_linear_input_is_not_saved() -> Grads:
    lin = torch.nn.Linear(4, 3).double().requires_grad_(False)
    w = _w(2, 4)
    h = w * 1
    y = lin(h)
    h.zero_()  # <write>
    y.sum().backward()
    return {"w": w.grad}


def frozen_linear_weight_written() -> Grads:
    lin = torch.nn.Linear(4, 3).double().requires_grad_(False)
    w = _w(2, 4)
    y = lin(w * 1)  # <saved>
    lin.weight.mul_(0.5)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def frozen_linear_weight_written_through_data() -> Grads:
    lin = torch.nn.Linear(4, 3).double().requires_grad_(False)
    w = _w(2, 4)
    y = lin(w * 1)  # <saved>
    lin.weight.data.mul_(0.5)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def data_write_the_backward_does_not_reach() -> Grads:
    w, v = _w(4), _w(4)
    s = torch.sigmoid(w * 1)
    loss = (s * 3).sum() + (v * 2).sum()
    s.data.mul_(2)  # <write>
    loss.backward(inputs=[v])
    return {"v": v.grad}


def hook_scales_its_gradient_in_place() -> Grads:
    w = _w(4)
    h = w * 1
    h.register_hook(lambda g: g.mul_(2))
    (h.sin() + h.cos()).sum().backward()
    return {"w": w.grad}


def reentrant_checkpoint_input_written() -> Grads:
    from torch.utils.checkpoint import checkpoint

    w = _w(4)
    h = w * 1
    y = checkpoint(torch.sin, h, use_reentrant=True)
    h.add_(1)  # <write>
    y.sum().backward()
    return {"w": w.grad}


def out_argument_under_no_grad() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    with torch.no_grad():
        torch.add(s, 1, out=s)  # <write>
    s.sum().backward()
    return {"w": w.grad}


def data_rebound_to_new_values() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    s.data = torch.zeros(4, dtype=torch.float64)  # <write>
    (s * 1).sum().backward()
    return {"w": w.grad}


def grad_with_respect_to_the_written_tensor() -> Grads:
    w = _w(4)
    s = torch.sigmoid(w * 1)
    s.mul_(2)  # <write>
    (g,) = torch.autograd.grad((s * s).sum(), s)
    return {"g": g}


def numpy_write_the_backward_does_not_reach() -> Grads:
    w, v = _w(4), _w(4)
    s = torch.sigmoid(w * 1)
    loss = (s * 3).sum() + (v * 2).sum()
    s.detach().numpy()[:] = 0  # <write>
    loss.backward(inputs=[v])
    return {"v": v.grad}


Case = tuple[Callable[[], Grads], Truth]
CASES: dict[str, Case] = {
    fn.__name__: (fn, truth)
    for fn, truth in [
        (mul_operand_without_grad_is_not_saved, Truth.HARMLESS),
        (mul_saves_the_operand_without_grad, Truth.RAISES),
        (add_and_sub_save_nothing, Truth.HARMLESS),
        (matmul_with_a_constant_saves_only_the_constant, Truth.HARMLESS),
        (relu_input_is_not_saved, Truth.HARMLESS),
        (relu_output_is_saved, Truth.RAISES),
        (tanh_input_is_not_saved, Truth.HARMLESS),
        (exp_output_is_saved, Truth.RAISES),
        (pow_saves_its_input_not_its_output, Truth.HARMLESS),
        (pow_input_written, Truth.RAISES),
        (log_output_written, Truth.HARMLESS),
        (div_by_a_constant_saves_only_the_divisor, Truth.HARMLESS),
        (where_saves_only_its_condition, Truth.HARMLESS),
        (dropout_output_written, Truth.HARMLESS),
        (backward_inputs_do_not_reach_the_node, Truth.HARMLESS),
        (autograd_grad_of_another_leaf, Truth.HARMLESS),
        (backward_inputs_reach_the_node, Truth.RAISES),
        (second_backward_of_a_retained_graph, Truth.RAISES),
        (write_after_backward, Truth.HARMLESS),
        (double_backward_after_the_write, Truth.RAISES),
        (write_under_no_grad, Truth.RAISES),
        (write_under_inference_mode, Truth.RAISES),
        (write_to_a_view_of_the_saved_tensor, Truth.RAISES),
        (write_to_the_base_of_a_saved_view_outside_it, Truth.RAISES),
        (write_through_detach, Truth.RAISES),
        (write_through_data, Truth.SILENT),
        (write_through_numpy, Truth.SILENT),
        (data_write_to_an_unsaved_tensor, Truth.HARMLESS),
        (checkpointed_input_written_after_the_region, Truth.RAISES),
        (checkpointed_region_writes_its_own_output, Truth.HARMLESS),
        (autocast_saves_a_cast_copy, Truth.HARMLESS),
        (function_saves_its_input, Truth.RAISES),
        (function_saves_its_output, Truth.RAISES),
        (function_marks_its_input_dirty, Truth.HARMLESS),
        (inplace_on_a_leaf_that_requires_grad, Truth.RAISES_AT_OP),
        (loop_writes_graphs_that_are_dropped, Truth.HARMLESS),
        (loop_writes_every_graph_only_the_last_backpropagated, Truth.RAISES),
        (write_that_changes_no_value, Truth.RAISES),
        (inplace_op_saves_its_own_result, Truth.RAISES),
        (inplace_op_whose_result_is_not_saved, Truth.HARMLESS),
        (mul_by_itself_in_place, Truth.RAISES),
        (mul_saves_both_only_one_needed, Truth.RAISES),
        (frozen_linear_input_is_not_saved, Truth.HARMLESS),
        (frozen_linear_weight_written, Truth.RAISES),
        (frozen_linear_weight_written_through_data, Truth.SILENT),
        (data_write_the_backward_does_not_reach, Truth.HARMLESS),
        (hook_scales_its_gradient_in_place, Truth.HARMLESS),
        (reentrant_checkpoint_input_written, Truth.RAISES),
        (out_argument_under_no_grad, Truth.RAISES),
        (data_rebound_to_new_values, Truth.HARMLESS),
        (grad_with_respect_to_the_written_tensor, Truth.HARMLESS),
        (numpy_write_the_backward_does_not_reach, Truth.HARMLESS),
    ]
}


# ---------------------------------------------------------------------------
# the harness
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _marker(fn: Callable[..., Any], name: str) -> int | None:
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, text in enumerate(lines) if text.rstrip().endswith(f"# <{name}>")]
    assert len(hits) <= 1, (fn.__name__, name, hits)
    return hits[0] if hits else None


def _run(fn: Callable[[], Grads]) -> tuple[Grads | None, BaseException | None]:
    torch.manual_seed(0)
    try:
        return fn(), None
    except RuntimeError as e:
        return None, e


def _meant(fn: Callable[[], Grads]) -> Grads:
    """The program the user meant: every saved tensor copied at save, autograd's version check off."""
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        grads, error = _run(fn)
    assert error is None, error
    assert grads is not None
    return grads


def _same(a: Grads, b: Grads) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _inplace_error(e: BaseException | None) -> bool:
    return e is not None and "modified by an inplace operation" in str(e)


def truth_of(fn: Callable[[], Grads]) -> Truth:
    grads, error = _run(fn)
    if _inplace_error(error):
        return Truth.RAISES
    if error is not None:
        if "leaf Variable that requires grad" in str(error) or "is a view and is being modified" in str(error):
            return Truth.RAISES_AT_OP
        raise error
    assert grads is not None
    return Truth.HARMLESS if _same(grads, _meant(fn)) else Truth.SILENT


@pytest.mark.parametrize("name", CASES)
def test_the_case_is_what_it_says(name: str) -> None:
    fn, truth = CASES[name]
    assert truth_of(fn) is truth


def _describe(findings: list[ipd.Finding]) -> str:
    return "\n".join(f"{f.code} {f.severity} confirmed={f.confirmed}: {f.message}" for f in findings) or "(none)"


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("name", CASES)
def test_the_claim_matches_what_pytorch_did(name: str, deep: bool) -> None:
    fn, truth = CASES[name]
    plain, plain_error = _run(fn)
    session, watched, error = ipd.watch(deep=deep), None, None
    torch.manual_seed(0)
    try:  # PyTorch's error leaves the session, as in a script
        with session:
            watched = fn()
    except RuntimeError as e:
        error = e
    if plain_error is None:
        assert error is None, error
        assert plain is not None and watched is not None and _same(plain, watched), "watch changed the gradients"
    else:
        assert error is not None
    findings = session.findings
    said = _describe(findings)
    serious = [f for f in findings if f.severity is not Severity.INFO]
    write, saved = _marker(fn, "write"), _marker(fn, "saved")
    if truth is Truth.HARMLESS:
        assert not serious, said
        for f in findings:
            assert f.confirmed is not True, said
            assert "raised" not in f.why, said
        return
    errors = [f for f in serious if f.severity is Severity.ERROR]
    assert errors, said
    assert all(f.confirmed is not False for f in errors), said
    codes = {
        Truth.RAISES: {"IPD101"},
        Truth.SILENT: {"IPD104", "IPD109"},
        Truth.RAISES_AT_OP: {"IPD102", "IPD103"},
    }[truth]
    main = [f for f in errors if f.code in codes]
    assert main, said
    f = main[0]
    assert f.mutation.line == write, said
    if saved is not None:  # the line, or the user's line that called it (a custom Function's forward)
        assert f.saved is not None and saved in {f.saved.line} | {fr.line for fr in f.saved.stack}, said
    if truth in (Truth.RAISES, Truth.SILENT):
        assert f.confirmed is True, said
    if truth is Truth.RAISES:  # one write raised: one finding, one occurrence (not the dropped graphs' too)
        assert "raised" in f.why and "will raise" not in f.why, said
        assert len(main) == 1 and f.count == 1, said


# ---------------------------------------------------------------------------
# the fix a finding carries is a claim too: applied, the program runs as meant
# ---------------------------------------------------------------------------

RAISING = [name for name, (_, truth) in CASES.items() if truth is Truth.RAISES]


def _fixed(fn: Callable[[], Grads], edits: tuple[Any, ...]) -> Callable[[], Grads]:
    """`fn` as the fix's edits leave it: the edited file's function of that name, run in this module."""
    from inplace_doctor.cli.proof.source_edits import plan

    ((before, after),) = plan(edits, str(Path.cwd())).values()
    assert before != after
    tree = ast.parse(after.decode())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn.__name__]
    namespace = dict(globals())
    exec(compile(ast.Module(body=[node], type_ignores=[]), __file__, "exec"), namespace)
    return namespace[fn.__name__]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", RAISING)
def test_the_fix_runs_the_meant_program(name: str) -> None:
    """The sentence names only methods tensors have, and the edits, applied, make the program run
    without error and compute the gradients of the program the user meant."""
    fn, _ = CASES[name]
    session = ipd.watch()
    with pytest.raises(RuntimeError), session:
        _run_raising(fn)
    (finding,) = [f for f in session.findings if f.code == "IPD101"]
    for receiver, method in re.findall(r"(\w+)(?:\[[^\]]*\])?\.([a-z][a-z0-9_]*)\(", finding.fix):
        assert receiver == "torch" or hasattr(torch.Tensor, method), finding.fix  # never `s.copy(...)`
    for new in re.findall(r"with `([^`]*)`", finding.fix):  # a call alone, out of place, drops the write
        body = ast.parse(new).body
        assert not (len(body) == 1 and isinstance(body[0], ast.Expr)), finding.fix
    edits = [e for fix in finding.fixes for e in fix.edits]
    if not edits:  # a manual fix: nothing to apply
        return
    fixed = _fixed(fn, tuple(edits))
    grads, error = _run(fixed)
    assert error is None, f"{finding.fix}\n{error}"
    assert grads is not None and _same(grads, _meant(fn)), finding.fix


def _run_raising(fn: Callable[[], Grads]) -> None:
    torch.manual_seed(0)
    fn()


def alive_graph_never_backpropagated() -> tuple[Grads, Any]:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    loss = (s * 3).sum()
    s.mul_(2)  # <write>
    return {}, loss  # the caller keeps the graph alive past the session


def retained_graph_not_run_again() -> tuple[Grads, Any]:
    w = _w(4)
    s = torch.sigmoid(w * 1)  # <saved>
    loss = (s * 3).sum()
    loss.backward(retain_graph=True)
    s.mul_(2)  # <write>
    return {"w": w.grad}, loss


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("case", [alive_graph_never_backpropagated, retained_graph_not_run_again])
def test_a_graph_alive_but_never_backpropagated_is_a_condition_not_an_error(case: Any, deep: bool) -> None:
    """No backward ran through the write while the session was active: PyTorch raised nothing, and a
    backward through the graph later would raise. The claim is an unconfirmed info worded as that
    condition, naming both lines."""
    with ipd.watch(deep=deep) as session:
        _, keep = case()
    (finding,) = session.findings
    assert (finding.code, finding.severity, finding.confirmed) == ("IPD101", Severity.INFO, False), finding.message
    assert finding.mutation.line == _marker(case, "write") and finding.saved is not None
    assert finding.saved.line == _marker(case, "saved")
    assert "A backward that reaches" in finding.why and "raised" not in finding.why, finding.why
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        keep.backward()  # the condition holds


def _slot_and_message(fn: Callable[[], Grads], deep: bool) -> tuple[str | None, str]:
    session = ipd.watch(deep=deep)
    with pytest.raises(RuntimeError), session:
        _run_raising(fn)
    (finding,) = [f for f in session.findings if f.code == "IPD101"]
    return finding.slot, finding.message


@pytest.mark.parametrize("name", RAISING)
def test_both_tracers_name_what_saved_the_tensor(name: str) -> None:
    """The slot that saved the tensor is named alike by both tracers, never as an op nobody saw
    (`h.mul_(h)` saves `h` before cloning `self` under a node of its own, a checkpoint saves its region's
    inputs under a node no hook names)."""
    fn, _ = CASES[name]
    (fast_slot, fast), (deep_slot, deep) = _slot_and_message(fn, False), _slot_and_message(fn, True)
    assert fast_slot == deep_slot, (fast, deep)
    for message in (fast, deep):
        assert "<unknown op>" not in message and "the output of <" not in message, message


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize(
    "name, counter_only",
    [
        ("write_to_the_base_of_a_saved_view_outside_it", True),
        ("write_to_a_view_of_the_saved_tensor", False),
        ("write_that_changes_no_value", False),
    ],
)
def test_a_write_beside_the_saved_elements_is_not_said_to_overwrite_them(name: str, counter_only: bool, deep: bool) -> None:
    """`b[2].zero_()` after `b[0].sin()` changes no element autograd saved; PyTorch raises because the
    view shares the base's version counter. The finding says exactly that, and is still an error."""
    fn, _ = CASES[name]
    session = ipd.watch(deep=deep)
    with pytest.raises(RuntimeError), session:
        _run_raising(fn)
    (finding,) = [f for f in session.findings if f.code == "IPD101"]
    assert finding.severity is Severity.ERROR and finding.confirmed is True
    assert getattr(finding.facts, "counter_only", None) is counter_only
    assert ("changing none of the elements autograd saved" in finding.what) is counter_only, finding.what
    assert ("overwrote" in finding.what) is not counter_only, finding.what


class _TwoHeads(torch.nn.Module):
    """Two outputs; the second's saved sigmoid output is overwritten in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x)
        a = torch.sigmoid(h)
        b = torch.sigmoid(h * 2)  # <head-saved>
        b.mul_(2)  # <head-write>
        return a, b


@pytest.mark.parametrize("deep", [False, True], ids=["fast", "deep"])
@pytest.mark.parametrize("only_first", [True, False], ids=["loss-of-the-first-head", "default-loss"])
def test_audit_claims_an_error_only_where_its_backward_raised(only_first: bool, deep: bool) -> None:
    """`audit` with a loss of the first head only: PyTorch raises nothing (the written tensor is not on
    the loss's path), so the claim is an unconfirmed info saying so; with the default loss (both heads)
    its backward raises, and the claim is a confirmed error."""
    model, x = _TwoHeads(), torch.randn(2, 4)
    loss_fn = (lambda out: out[0].sum()) if only_first else None
    torch.manual_seed(0)
    if only_first:  # the truth: no error, plainly
        loss_fn(model(x)).backward()
    else:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            sum(o.sum() for o in model(x)).backward()
    (finding,) = ipd.audit(model, x, loss_fn=loss_fn, deep=deep).findings
    forward = _TwoHeads.forward
    assert finding.code == "IPD101"
    assert finding.mutation.line == _marker(forward, "head-write") and finding.saved is not None
    assert finding.saved.line == _marker(forward, "head-saved")
    if only_first:
        assert (finding.severity, finding.confirmed) == (Severity.INFO, False)
        assert "not on the loss's path" in finding.unconfirmed_reason and "will raise" in finding.why
    else:
        assert (finding.severity, finding.confirmed) == (Severity.ERROR, True)
        assert "raised" in finding.why and "will raise" not in finding.why
