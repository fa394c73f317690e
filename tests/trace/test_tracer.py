"""The tracer on its own: the events it reports, and that it leaves nothing behind."""

from __future__ import annotations

import gc
import linecache
import traceback

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from inplace_doctor.events import SavedTensorOverwritten, StaleSavedTensorUsed
from inplace_doctor.trace.ops import op_name, write_spec
from inplace_doctor.trace.places.stacks import SAVE_STACK, is_user_file
from inplace_doctor.trace.tracer import Tracer


class Recorder(list):
    def __call__(self, event):
        self.append(event)
        return None


def overwrites(events, shares=None):
    return [
        e
        for e in events
        if isinstance(e, SavedTensorOverwritten) and (shares is None or e.shares_version_counter == shares)
    ]


def traced(fn):
    """Run fn under a tracer; fn returns what it must keep alive (a graph that
    is already freed cannot raise, so writes to it are rightly not reported)."""
    events = Recorder()
    with Tracer(events):
        keep = fn()
    del keep
    return events


def test_write_specs_come_from_op_schemas():
    aten = torch.ops.aten
    assert write_spec(aten.relu_.default) == (("self", 0),)
    assert write_spec(aten.add.out) == (("out", 3),)
    assert write_spec(aten._foreach_add_.List)[0][0] == "self"
    assert write_spec(aten.relu.default) == ()
    assert write_spec(aten.native_batch_norm.default) == ()  # running stats: invisible
    assert op_name(aten.add_.Tensor) == "aten.add_"


@pytest.mark.parametrize(
    "name, write",
    [
        ("relu_", lambda s: s.relu_()),
        ("iadd", lambda s: s.__iadd__(1)),
        ("setitem-mask", lambda s: s.__setitem__(s > 0.5, 0.0)),
        ("setitem-index", lambda s: s.__setitem__(0, 1.0)),
        ("out=", lambda s: torch.add(torch.ones(3), 1, out=s)),
        ("copy_", lambda s: s.copy_(torch.zeros(3))),
        ("foreach", lambda s: torch._foreach_mul_([s], 2.0)),
        ("dropout-inplace", lambda s: nn.functional.dropout(s, 0.5, True, inplace=True)),
        ("view-write", lambda s: s.view(3, 1).mul_(2)),
    ],
)
def test_every_kind_of_write_to_a_saved_output_is_reported_with_its_op(name, write):
    def run():
        x = torch.randn(3, requires_grad=True)
        s = torch.sigmoid(x)
        with torch.no_grad():
            write(s)
        return s

    [event] = overwrites(traced(run))
    assert event.shares_version_counter
    assert event.saved.node == "SigmoidBackward0" and event.saved.field == "result"
    assert event.saved.version == 0 and event.version_now >= 1
    assert event.write.site.op.startswith("aten.")


def test_data_write_is_reported_as_not_sharing_the_counter():
    def run():
        x = torch.randn(3, requires_grad=True)
        s = torch.sigmoid(x)
        s.data.mul_(2)
        return s

    [event] = overwrites(traced(run))
    assert not event.shares_version_counter and event.write.writes_bytes


def test_metadata_only_inplace_ops_are_not_byte_writes():
    def run():
        x = torch.randn(3, 1, requires_grad=True)
        s = torch.sigmoid(x)
        s.data.squeeze_(1)  # no bytes written, separate counter: nothing to report
        return s

    assert overwrites(traced(run)) == []


def test_batchnorm_running_stats_saved_but_not_read_in_training():
    events = Recorder()
    bn = nn.BatchNorm1d(3)
    with Tracer(events) as tracer:
        out = bn(torch.randn(4, 3, requires_grad=True))
        tracer.flush()
        fields = {}
        for bucket in tracer._saved.by_storage.values():
            for ref in bucket.values():
                record = ref()
                fields[record.field] = record.read
    assert fields["running_mean"] is False and fields["running_var"] is False
    assert fields["input"] is True
    out.sum().backward()


def test_unpack_rechecks_versions_that_the_hooks_switched_off():
    events = Recorder()
    with Tracer(events):
        x = torch.randn(3, requires_grad=True)
        s = torch.sigmoid(x)
        s.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s.sum().backward()
    stale = [e for e in events if isinstance(e, StaleSavedTensorUsed)]
    assert stale and stale[0].node == "SigmoidBackward0"


def test_writes_to_saved_tensors_released_by_backward_are_not_reported():
    def run():
        x = torch.randn(3, requires_grad=True)
        s = torch.sigmoid(x)
        s.sum().backward()
        with torch.no_grad():
            s.mul_(2)
        return s

    assert overwrites(traced(run)) == []


def _global_state():
    mm = torch.nn.modules.module
    return (
        len(mm._global_forward_pre_hooks),
        len(mm._global_forward_hooks),
        torch._C._autograd._top_saved_tensors_default_hooks(False),
        _get_current_dispatch_mode(),
    )


def test_everything_removed_on_exit_and_on_exception():
    before = _global_state()
    events = Recorder()
    tracer = Tracer(events, fail_fast=True)
    with tracer:
        assert _global_state() != before
    assert _global_state() == before
    with pytest.raises(ZeroDivisionError), Tracer(events):
        nn.Linear(2, 2)(torch.randn(1, 2))
        1 / 0  # noqa: B018 (raises)
    assert _global_state() == before
    x = torch.randn(2, requires_grad=True)
    torch.sigmoid(x)  # creates a node: the node-creation hook must be gone
    assert tracer._saved.pending_nodes == []


def test_tracer_refuses_reentry_and_keeps_no_saved_tensor_alive():
    events = Recorder()
    tracer = Tracer(events)
    with tracer:
        with pytest.raises(RuntimeError, match="already active"):
            tracer.__enter__()
        for _ in range(50):
            y = torch.sigmoid(torch.randn(64, requires_grad=True) * 2)
            del y
    gc.collect()
    assert tracer.live_saved_tensors() == 0
    assert tracer.saves == 50  # x * 2 saves nothing; sigmoid saves its output


def test_module_paths_and_call_indices():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(3, 3), nn.Sigmoid())
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.act(self.block(x)))

    events = Recorder()
    net = Net()
    with Tracer(events) as tracer:
        tracer.modules.add_root(net)
        net(torch.randn(2, 3, requires_grad=True))
    [event] = overwrites(events)
    assert event.saved.site.module == "block.1" and event.saved.site.module_type == "Sigmoid"
    assert event.write.site.module == "act" and event.write.site.module_call == 1
    assert event.write.site.module_inplace is True


def test_save_location_is_resolved_from_the_stack_captured_at_the_save():
    """Saves capture the stack in C and resolve it only for a finding: the same
    user frames, lines and torch API a frame walk at the save sees."""
    walked = []

    def saved_sigmoid(x):
        walked.append([(f.filename, f.lineno, f.name) for f in traceback.extract_stack() if is_user_file(f.filename)])
        y = torch.sigmoid(x)  # saves its output
        y.mul_(2)
        return y

    events = Recorder()
    with Tracer(events):
        x = torch.randn(2, 3, requires_grad=True)
        out = saved_sigmoid(x)
    [event] = overwrites(events)
    site = event.saved.site
    assert site.code == "y = torch.sigmoid(x)  # saves its output"
    [frames] = walked  # a plain Python frame walk, one line above the save
    expected = [*frames[:-1], (frames[-1][0], frames[-1][1] + 1, "saved_sigmoid")][-SAVE_STACK:]
    assert [(f.file, f.line, f.function) for f in site.stack] == expected
    assert site.api is None
    assert event.saved.in_checkpoint is False
    del out

    # A save inside a torch module: the API the user's line entered is its qualified name.
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x):
            return self.linear(x)

    with Tracer(Recorder()) as tracer:
        net = Net()
        out = net(torch.randn(2, 3, requires_grad=True))
        records = [ref() for bucket in tracer._saved.by_storage.values() for ref in bucket.values()]
        linear_saves = [r for r in records if r is not None and r.module[2] == "Linear"]
        assert linear_saves
        for record in linear_saves:
            frames, api, module, phase, in_region = record.where()
            assert api == "Linear.forward" and phase == "forward" and not in_region
            assert frames[-1][2] == "forward" and "self.linear(x)" in linecache.getline(frames[-1][0], frames[-1][1])
        del records, linear_saves, record, out


def test_module_stack_recovers_after_an_exception_caught_inside():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    net = nn.Sequential(nn.Linear(2, 2), Boom())
    events = Recorder()
    with Tracer(events) as tracer:
        tracer.modules.add_root(net)
        with pytest.raises(ValueError):
            net(torch.randn(1, 2))
        assert tracer.modules.current[0] == "1"  # the stack as the error left it
        net[1] = nn.Identity()
        net(torch.randn(1, 2))  # the root re-entered while on the stack: stale entries dropped
        assert tracer.modules.current is None


FOREACH = {
    "mul": lambda a: torch._foreach_mul_(a, 2.0),
    "add": lambda a: torch._foreach_add_(a, a),
    "lerp": lambda a: torch._foreach_lerp_(a, [torch.ones(3)] * len(a), 0.5),
    "zero": lambda a: torch._foreach_zero_(a),
}


@pytest.mark.parametrize("name", list(FOREACH))
def test_foreach_ops_bump_versions_inside_the_tracer_exactly_as_in_plain_pytorch(name):
    """torch 2.14 skips these bumps under any Python dispatch mode; the tracer restores them."""

    def delta(traced_run):
        a = [torch.randn(3), torch.randn(3)]
        with torch.no_grad():
            if traced_run:
                with Tracer(Recorder()):
                    FOREACH[name](a)
            else:
                FOREACH[name](a)
        return [t._version for t in a]

    assert delta(True) == delta(False) == [1, 1]


def _gan_order(optimizer_kwargs):
    torch.manual_seed(0)
    last = nn.Linear(3, 1)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), last)
    opt = torch.optim.Adam(model.parameters(), lr=0.1, **optimizer_kwargs)
    model(torch.randn(2, 3)).sum().backward()
    out = model(torch.randn(2, 3)).sum()
    opt.step()  # modifies last.weight, which `out`'s graph saved
    out.backward()


def test_foreach_optimizer_between_forward_and_backward_still_raises_inside_watch():
    import inplace_doctor as ipd

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _gan_order({"foreach": True})
    with pytest.raises(ipd.InplaceError) as raised, ipd.watch():
        _gan_order({"foreach": True})
    assert raised.value.findings[0].code == "IPD101"


def test_fused_adam_writes_without_a_version_bump_and_is_reported_as_silent():
    """Fused Adam updates parameters without bumping versions, even in plain PyTorch:
    the GAN-order bug then computes wrong gradients with no error at all."""
    import inplace_doctor as ipd

    _gan_order({"fused": True})  # plain PyTorch: no error
    with ipd.watch() as session:
        _gan_order({"fused": True})
    [finding] = [f for f in session.findings if f.code == "IPD104"]
    assert finding.mutation.op == "aten._fused_adam_" and finding.mutation.api == "Adam.step"
    assert finding.slot == "AddmmBackward0.mat2"


def test_a_compiled_function_called_inside_the_tracer_never_traces_the_tracer():
    """The dispatch mode stays dynamo-disabled (torch's wrapper, or ours without its lazy-import layer)."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(lambda x: x.sin() * 2 + 1, backend=counter)
    x = torch.randn(4, requires_grad=True)
    events = Recorder()
    with Tracer(events):
        out = compiled(x)
        out.sum().backward()
    assert counter.frame_count == 0  # unwrapped, dynamo compiles three of the tracer's own frames
    assert torch.equal(out, x.sin() * 2 + 1) and torch.equal(x.grad, 2 * x.cos()) and not events
    torch._dynamo.reset()
