"""A CUDA backward runs on autograd's device thread, not the caller's: what the tool confirms there.

IPD101 confirmed by that backward under both tracers (watch, audit), the clean look-alike silent,
and a watched training run bit-identical to the plain one.
"""

from __future__ import annotations

import inspect
import threading

import pytest
import torch
from _cpu_tests import load
from conftest import line_of

import inplace_doctor as ipd
from inplace_doctor.examples import LinearThenReLU, SigmoidThenReLU

recompute = load("rules/test_ipd111_recompute.py")  # `_watch(deep)`: either tracer, each with the rules it serves

pytestmark = pytest.mark.cuda
EXAMPLES = inspect.getsourcefile(SigmoidThenReLU)
assert EXAMPLES is not None


def _backward_thread(out: torch.Tensor) -> list[int]:
    """The thread that runs backward through `out`, appended when its gradient arrives."""
    threads: list[int] = []
    out.register_hook(lambda grad: threads.append(threading.get_ident()))
    return threads


def test_a_cuda_backward_runs_on_the_device_thread() -> None:
    """The premise of this file: on CPU the calling thread runs backward, on CUDA autograd's own thread."""
    out = SigmoidThenReLU().cuda()(torch.randn(4, 8, device="cuda"))
    threads = _backward_thread(out)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    assert threads and threads[0] != threading.get_ident()


@recompute.MODES
def test_watch_confirms_ipd101_at_a_backward_on_the_device_thread(deep: bool) -> None:
    torch.manual_seed(0)
    model, x = SigmoidThenReLU().cuda(), torch.randn(4, 8, device="cuda")
    with pytest.raises(ipd.InplaceError) as caught, recompute._watch(deep) as session:
        out = model(x)
        threads = _backward_thread(out)
        out.sum().backward()
    assert threads and threads[0] != threading.get_ident()
    [finding] = caught.value.findings
    assert finding.code == "IPD101" and finding.confirmed is True and finding.severity is ipd.Severity.ERROR
    assert (finding.mutation.line, finding.saved.line if finding.saved else None) == (
        line_of(EXAMPLES, "return self.act(gate)"), line_of(EXAMPLES, "gate = torch.sigmoid(self.fc(x))")
    )
    assert [f.code for f in session.findings] == ["IPD101"]


@recompute.MODES
def test_audit_on_cuda_confirms_ipd101_and_passes_the_clean_look_alike(deep: bool) -> None:
    report = ipd.audit(SigmoidThenReLU().cuda(), torch.randn(4, 8, device="cuda"), deep=deep)
    assert report.backward and [(f.code, f.confirmed) for f in report.findings] == [("IPD101", True)]
    clean = ipd.audit(LinearThenReLU().cuda(), torch.randn(4, 8, device="cuda"), deep=deep)
    assert clean.backward and clean.findings == []


def _train(model: torch.nn.Module, steps: int = 2) -> list[torch.Tensor]:
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 8, device="cuda")).pow(2).sum().backward()
        opt.step()
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


@recompute.MODES
def test_watched_training_on_cuda_is_bit_identical_to_the_plain_run(deep: bool) -> None:
    torch.manual_seed(0)
    plain = _train(LinearThenReLU().cuda())
    torch.manual_seed(0)
    model = LinearThenReLU().cuda()
    with recompute._watch(deep) as session:
        watched = _train(model)
    assert session.findings == []
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
