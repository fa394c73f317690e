"""PyTorch behaviours inplace_doctor relies on, pinned against plain torch.

If a torch upgrade changes any of these, the tool's tracing logic needs a
second look before the failure is "fixed" here.
"""

from __future__ import annotations

import gc
import re
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

aten = torch.ops.aten
saved_tensors_hooks = torch.autograd.graph.saved_tensors_hooks


def _identity(t):
    return t


class _Holder:
    """What a well-behaved pack hook returns: a small box, never the tensor itself."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


def _raises_matching(fragment, fn):
    with pytest.raises(RuntimeError, match=re.compile(re.escape(fragment), re.IGNORECASE)):
        fn()


class _NodeCollector:
    """Install a node-creation hook for a `with` block; pop it in `finally`."""

    def __init__(self, on_node=None):
        self.nodes = []
        self._on_node = on_node

    def _hook(self, node):
        self.nodes.append(node)
        if self._on_node is not None:
            self._on_node(node)

    def __enter__(self):
        torch._C._autograd._push_node_creation_hook(self._hook)
        return self

    def __exit__(self, *exc):
        torch._C._autograd._pop_node_creation_hook()
        return False

    def named(self, name):
        return [n for n in self.nodes if n.name() == name]


# --- 1. version counters ---------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda t: t.add_(1), id="add_"),
        pytest.param(lambda t: t.relu_(), id="relu_"),
        pytest.param(lambda t: t.__iadd__(1), id="+="),
        pytest.param(lambda t: t.__setitem__((slice(None), 0), 0), id="setitem"),
    ],
)
def test_version_bumps_once_per_inplace_op(mutate):
    """`_version` rises by exactly one per in-place op: the tool's mutation detector diffs it."""
    x = torch.randn(3, 4)
    before = x._version
    mutate(x)
    assert x._version == before + 1


def test_views_and_detach_share_the_base_version_counter():
    """Views and detach() share the base's counter, so a write through any alias is seen on the saved tensor."""
    base = torch.randn(3, 4)
    view = base[0]
    detached = base.detach()
    before = base._version
    view.add_(1)
    assert base._version == view._version == detached._version == before + 1
    detached.mul_(2)
    assert base._version == view._version == detached._version == before + 2


def test_dot_data_shares_storage_but_has_its_own_counter():
    """`.data` writes are invisible to `_version`: the tool must not promise to catch them."""
    s = torch.randn(3, requires_grad=True)
    before = s._version
    alias = s.data
    assert alias.data_ptr() == s.data_ptr()
    alias.mul_(0.5)
    assert alias._version == 1
    assert s._version == before
    s.data.mul_(0.5)
    assert s._version == before


def test_inplace_under_no_grad_still_bumps_version():
    """no_grad in-place writes bump the counter, so optimizer-style updates still register as mutations."""
    s = torch.randn(3, requires_grad=True)
    before = s._version
    with torch.no_grad():
        s.mul_(2)
    assert s._version == before + 1


# --- 2. version bump timing relative to a dispatch mode ----------------------


def test_version_bump_happens_after_dispatch_mode_returns():
    """Inside __torch_dispatch__ the mutated arg still shows the old version; the tool must not read the bump there."""
    seen = {}

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is aten.relu_.default:
                seen["before"] = args[0]._version
                out = func(*args, **kwargs)
                seen["after_call"] = args[0]._version
                return out
            return func(*args, **kwargs)

    t = torch.randn(3)
    start = t._version
    with Probe():
        t.relu_()
    assert seen == {"before": start, "after_call": start}
    assert t._version == start + 1


# --- 3. op schemas -------------------------------------------------------------


def _arg(schema, name):
    [arg] = [a for a in schema.arguments if a.name == name]
    return arg


def test_relu_inplace_schema_marks_self_written():
    """The tool finds the mutated tensor of an in-place op from the schema's write alias on `self`."""
    schema = aten.relu_.default._schema
    assert schema.is_mutable
    self_arg = _arg(schema, "self")
    assert self_arg.alias_info is not None and self_arg.alias_info.is_write


def test_add_out_schema_marks_out_kwarg_written():
    """out= variants are mutations of the `out` kwarg, found through the schema."""
    schema = aten.add.out._schema
    assert schema.is_mutable
    out_arg = _arg(schema, "out")
    assert out_arg.kwarg_only
    assert out_arg.alias_info is not None and out_arg.alias_info.is_write
    for name in ("self", "other"):
        assert _arg(schema, name).alias_info is None


def test_foreach_add_inplace_schema_marks_tensor_list_written():
    """Fused optimizers use _foreach_*_ ops; the tool must treat every tensor in the `self` list as written."""
    schema = aten._foreach_add_.List._schema
    assert schema.is_mutable
    self_arg = _arg(schema, "self")
    assert str(self_arg.type) == "List[Tensor]"
    assert self_arg.alias_info is not None and self_arg.alias_info.is_write
    assert _arg(schema, "other").alias_info is None


def test_native_batch_norm_schema_is_not_mutable():
    """BatchNorm's running-stat write is not declared in its schema, so a dispatch mode cannot see it."""
    schema = aten.native_batch_norm.default._schema
    assert not schema.is_mutable
    assert all(a.alias_info is None for a in schema.arguments)


def test_batchnorm_training_updates_running_mean_without_version_bump():
    """running_mean changes value but not `_version`, which is why the tool special-cases batch-norm buffers."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(4)
    bn.train()
    old = bn.running_mean.clone()
    before = bn.running_mean._version
    bn(torch.randn(8, 4) + 3.0)
    assert not torch.equal(old, bn.running_mean)
    assert bn.running_mean._version == before


def test_an_inplace_op_bumps_the_versions_of_what_it_returns_not_of_every_argument_it_writes():
    """`rrelu_with_noise_` writes `noise` (`Tensor(b!)` in its schema) and returns only `self`:
    PyTorch's generated ADInplaceOrView kernel bumps the returned tensor's version alone, so a write
    kernel of the tool's that bumped `noise` too made backward raise where plain PyTorch does not."""
    schema = aten.rrelu_with_noise_.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["self", "noise"] and len(schema.returns) == 1
    x, noise = torch.randn(5).clone(), torch.empty(5)
    aten.rrelu_with_noise_(x, noise, 0.1, 0.3, True)
    assert (x._version, noise._version) == (1, 0)


# --- 4. saved_tensors_hooks disable autograd's own version check --------------


def _sigmoid_then_inplace_backward():
    x = torch.randn(4, requires_grad=True)
    y = torch.sigmoid(x)
    y.mul_(2)
    y.sum().backward()


def test_saved_tensors_hooks_disable_autograd_version_check():
    """With pack/unpack hooks, backward silently uses a modified saved tensor: the tool must re-check versions."""
    with saved_tensors_hooks(_identity, _identity):
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)
    y.mul_(2)
    y.sum().backward()  # must not raise
    assert x.grad is not None


def test_without_hooks_autograd_raises_on_modified_saved_tensor():
    """Plain autograd raises the 'modified by an inplace operation' error the tool reproduces and explains."""
    _raises_matching("modified by an inplace operation", _sigmoid_then_inplace_backward)


# --- 5. pack ordering relative to a dispatch mode -----------------------------


def test_pack_order_inputs_before_dispatch_outputs_after():
    """Saved inputs are packed before the mode sees the op, saved outputs after: the tool pairs events by this order."""
    log = []

    class Logger(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            log.append(("dispatch", func))
            return func(*args, **(kwargs or {}))

    def pack(t):
        log.append(("pack", None))
        return t

    x = torch.randn(3, requires_grad=True)
    with saved_tensors_hooks(pack, _identity), Logger():
        torch.sin(x)
        sin_events = list(log)
        log.clear()
        torch.sigmoid(x)
        sigmoid_events = list(log)
    assert sin_events == [("pack", None), ("dispatch", aten.sin.default)]
    assert sigmoid_events == [("dispatch", aten.sigmoid.default), ("pack", None)]


# --- 6. node creation hook -------------------------------------------------------


def test_node_creation_hook_exists_and_push_pop_balance():
    """The private push/pop node-creation hook API the tracer uses must still exist."""
    assert callable(torch._C._autograd._push_node_creation_hook)
    assert callable(torch._C._autograd._pop_node_creation_hook)
    with _NodeCollector() as col:
        torch.randn(2, requires_grad=True).exp()
    count = len(col.nodes)
    torch.randn(2, requires_grad=True).exp()
    assert len(col.nodes) == count  # popped: no more deliveries


def test_node_creation_hook_sees_packed_holder_for_builtin_node():
    """SigmoidBackward0's `_raw_saved_result.data` is the pack holder itself, already set when the hook fires."""
    holders = []

    def pack(t):
        h = _Holder(t.detach())
        holders.append(h)
        return h

    def unpack(h):
        return h.t

    at_hook = {}

    def on_node(node):
        if node.name() == "SigmoidBackward0":
            raw = node._raw_saved_result
            at_hook["type"] = type(raw)
            at_hook["data_is_holder"] = bool(holders) and raw.data is holders[-1]
            at_hook["unpack_hook"] = raw.unpack_hook

    x = torch.randn(3, requires_grad=True)
    with _NodeCollector(on_node) as col, saved_tensors_hooks(pack, unpack):
        y = torch.sigmoid(x)
    [node] = col.named("SigmoidBackward0")
    assert node is y.grad_fn
    assert len(holders) == 1
    assert at_hook["type"] is torch._C._autograd.SavedTensor
    assert at_hook["data_is_holder"] is True
    assert at_hook["unpack_hook"] is unpack
    assert node._raw_saved_result.data is holders[0]


def test_node_creation_hook_sees_packed_holder_for_custom_function():
    """A custom Function's `_raw_saved_tensors[i].data` is the pack holder, so user Functions are traced too."""
    holders = []

    def pack(t):
        h = _Holder(t.detach())
        holders.append(h)
        return h

    def unpack(h):
        return h.t

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * 2

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return g * 2

    at_hook = {}

    def on_node(node):
        if node.name() == "DoubleBackward":
            raw = node._raw_saved_tensors
            at_hook["n"] = len(raw)
            at_hook["data_is_holder"] = bool(holders) and raw[0].data is holders[-1]

    x = torch.randn(3, requires_grad=True)
    with _NodeCollector(on_node) as col, saved_tensors_hooks(pack, unpack):
        y = Double.apply(x)
    [node] = col.named("DoubleBackward")
    assert node is y.grad_fn
    assert at_hook == {"n": 1, "data_is_holder": True}
    assert len(holders) == 1
    assert node._raw_saved_tensors[0].data is holders[0]
    assert node._raw_saved_tensors[0].unpack_hook is unpack


# --- 7. checkpoint and SavedTensor.data -----------------------------------------


def test_saved_tensor_data_does_not_trigger_checkpoint_recompute():
    """Reading `SavedTensor.data` is side-effect free under checkpoint, unlike `_saved_self`, so the tracer reads `.data`."""
    calls = [0]

    def fn(a):
        calls[0] += 1
        return torch.sin(a)

    x = torch.randn(3, requires_grad=True)
    with _NodeCollector() as col:
        y = checkpoint(fn, x, use_reentrant=False)
    assert calls[0] == 1
    [node] = col.named("SinBackward0")
    assert node is y.grad_fn

    _ = node._raw_saved_self.data
    assert calls[0] == 1
    _ = node._saved_self
    assert calls[0] == 2


# --- 8. exceptions from unpack hooks --------------------------------------------


def test_unpack_hook_exception_keeps_its_type_through_backward():
    """An error raised in unpack surfaces from backward() with its own class, so the tool's error type reaches the user."""

    class CorruptionDetected(RuntimeError):
        pass

    def unpack(_t):
        raise CorruptionDetected("saved tensor was modified")

    x = torch.randn(3, requires_grad=True)
    with saved_tensors_hooks(_identity, unpack):
        y = torch.sigmoid(x)
    with pytest.raises(CorruptionDetected, match="saved tensor was modified"):
        y.sum().backward()


# --- 9. current autograd node ----------------------------------------------------


def test_current_autograd_node_none_in_forward_and_set_in_unpack():
    """`_current_autograd_node()` names the node reading a saved tensor during backward, and is None in forward."""
    at_pack = []
    at_unpack = []

    def pack(t):
        at_pack.append(torch._C._current_autograd_node())
        return t

    def unpack(t):
        at_unpack.append(torch._C._current_autograd_node())
        return t

    assert torch._C._current_autograd_node() is None
    x = torch.randn(3, requires_grad=True)
    with saved_tensors_hooks(pack, unpack):
        y = torch.sigmoid(x)
    node = y.grad_fn
    y.sum().backward()
    assert at_pack == [None]
    assert len(at_unpack) == 1
    assert at_unpack[0] is not None and at_unpack[0].name() == "SigmoidBackward0"
    assert at_unpack[0] is node


# --- 10. forward-time in-place errors and their message fragments ----------------


def _leaf_inplace():
    torch.randn(3, requires_grad=True).add_(1)


def _view_of_leaf_inplace():
    torch.randn(3, 4, requires_grad=True)[0].add_(1)


def _expanded_inplace():
    torch.randn(1, 4).expand(3, 4).add_(1)


def _unbind_output_inplace():
    a, _b, _c = (torch.randn(3, 4, requires_grad=True) * 1).unbind(0)
    a.add_(1)


def _split_output_inplace():
    a, _b = (torch.randn(4, 4, requires_grad=True) * 1).split(2)
    a.mul_(2)


def _no_grad_view_inplace():
    x = torch.randn(3, 4, requires_grad=True) * 1
    with torch.no_grad():
        v = x[0]
    v.add_(1)


def _backward_hook_output_inplace():
    m = torch.nn.Linear(4, 4)
    m.register_full_backward_hook(lambda *args: None)
    m(torch.randn(2, 4, requires_grad=True)).relu_()


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        pytest.param(_leaf_inplace, "leaf Variable that requires grad", id="leaf"),
        pytest.param(_view_of_leaf_inplace, "view of a leaf Variable", id="view-of-leaf"),
        pytest.param(
            _expanded_inplace,
            "more than one element of the written-to tensor refers to a single memory location",
            id="expand",
        ),
        pytest.param(_unbind_output_inplace, "function that returns multiple views", id="unbind"),
        pytest.param(_split_output_inplace, "function that returns multiple views", id="split"),
        pytest.param(_no_grad_view_inplace, "created in no_grad mode", id="no-grad-view"),
        pytest.param(_backward_hook_output_inplace, "BackwardHookFunction", id="full-backward-hook"),
    ],
)
def test_forward_inplace_error_messages(fn, fragment):
    """Forward-time in-place errors still carry the message fragments the tool matches to classify them."""
    _raises_matching(fragment, fn)


# --- 11. which nodes save what ----------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(torch.sigmoid, id="sigmoid"),
        pytest.param(torch.tanh, id="tanh"),
        pytest.param(torch.exp, id="exp"),
        pytest.param(torch.relu, id="relu"),
        pytest.param(lambda t: torch.softmax(t, -1), id="softmax"),
    ],
)
def test_ops_that_save_their_result(fn):
    """These ops save their output, so an in-place op on the output (e.g. relu_ after sigmoid) breaks backward."""
    x = torch.randn(3, 4, requires_grad=True)
    y = fn(x)
    assert hasattr(y.grad_fn, "_saved_result")
    saved = y.grad_fn._saved_result
    assert isinstance(saved, torch.Tensor)
    assert torch.equal(saved, y)


def test_ops_that_save_their_inputs():
    """sin, mm and tensor*tensor save inputs, so in-place on an input before backward breaks them."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    other = torch.randn(3, 4, requires_grad=True)

    sin_node = torch.sin(x).grad_fn
    assert torch.equal(sin_node._saved_self, x)
    assert not hasattr(sin_node, "_saved_result")

    mm_node = torch.mm(x, w).grad_fn
    assert torch.equal(mm_node._saved_self, x)
    assert torch.equal(mm_node._saved_mat2, w)

    mul_node = (x * other).grad_fn
    assert torch.equal(mul_node._saved_self, x)
    assert torch.equal(mul_node._saved_other, other)

    h = x * 1
    s = torch.sin(h)
    h.add_(1)
    _raises_matching("modified by an inplace operation", lambda: s.sum().backward())


def test_scalar_mul_and_add_save_nothing_a_later_inplace_breaks():
    """`x * 2` and `x + y` don't need x at backward: the tool must not flag in-place writes after them."""
    a = torch.randn(3, requires_grad=True)
    h = a * 1
    z = h * 2
    h.add_(1)
    z.sum().backward()
    assert torch.equal(a.grad, torch.full((3,), 2.0))

    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    h = a * 1
    z = h + b
    h.add_(1)
    z.sum().backward()
    assert torch.equal(a.grad, torch.ones(3))
    assert torch.equal(b.grad, torch.ones(3))


# --- 12. pack returning the tensor leaks dropped graphs --------------------------


def _drop_graphs(pack, unpack, n=50):
    """Build `x.exp()` n times under hooks, drop each; return weakrefs to the outputs."""
    x = torch.randn(64, requires_grad=True)
    refs = []
    with saved_tensors_hooks(pack, unpack):
        for _ in range(n):
            y = x.exp()
            refs.append(weakref.ref(y))
            del y
    gc.collect()
    return refs


def _live_tensor_count():
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is torch.Tensor or type(o) is torch.nn.Parameter)


def test_pack_returning_holder_does_not_leak_dropped_graphs():
    """A holder around `t.detach()` lets a dropped graph be freed: the tool's pack hook must never return `t`."""
    saved_refs = []

    def pack(t):
        d = t.detach()
        saved_refs.append(weakref.ref(d))
        return _Holder(d)

    def unpack(h):
        return h.t

    _drop_graphs(pack, unpack, n=1)  # warm-up: any lazily created tensors exist now
    saved_refs.clear()
    before = _live_tensor_count()
    refs = _drop_graphs(pack, unpack)
    after = _live_tensor_count()
    assert [r() for r in refs] == [None] * 50
    assert len(saved_refs) == 50
    assert [r() for r in saved_refs] == [None] * 50
    assert after <= before


def test_pack_returning_tensor_itself_leaks_dropped_graphs():
    """Returning `t` from pack makes output -> grad_fn -> SavedTensor -> output cycle that gc cannot break."""
    # On torch 2.14.1 this really leaks: the cycle runs through C++ (the
    # SavedTensor keeps a strong Python reference to the output), invisible to
    # the cycle collector, so every dropped graph and its output stay alive.
    refs = _drop_graphs(_identity, _identity)
    assert all(r() is not None for r in refs)


# -- memory handed out of PyTorch (IPD109) --------------------------------------------------

class _SeenFunctions(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def test_numpy_dlpack_and_data_ptr_reach_torch_function_but_to_dlpack_does_not():
    import numpy as np

    t = torch.randn(4)
    with _SeenFunctions() as seen:
        t.numpy()
        t.data_ptr()
        np.from_dlpack(t)  # calls t.__dlpack__()
        torch.utils.dlpack.to_dlpack(t)  # a C function: no __torch_function__
    assert seen.names == ["numpy", "data_ptr", "__dlpack__"]
    assert torch.Tensor.numpy.__name__ == "numpy" and torch.Tensor.__dlpack__.__name__ == "__dlpack__"


def test_a_numpy_write_into_a_saved_tensor_bumps_no_version_and_backward_reads_it():
    x = torch.randn(4, requires_grad=True)
    s = torch.sigmoid(x)
    expected = torch.autograd.grad(s.sum(), x, retain_graph=True)[0]
    a = s.detach().numpy()
    a *= 0.5
    assert s._version == 0
    (grad,) = torch.autograd.grad(s.sum(), x)
    assert not torch.equal(grad, expected)  # no error: silently different gradients


def test_numpy_keeps_the_storage_python_object_not_the_tensor_it_was_called_on():
    t = torch.randn(4)
    d = t.detach()
    tensor_ref, storage_ref = weakref.ref(d), weakref.ref(d.untyped_storage())
    a = d.numpy()
    del d, t
    gc.collect()
    assert tensor_ref() is None  # the array's base is another Python tensor object
    assert storage_ref() is not None  # one Python object per storage, alive with the memory
    del a
    gc.collect()
    assert storage_ref() is None


def test_hash_tensor_is_an_order_blind_xor():
    """Why the tool's fingerprint is its own: swapping two elements leaves hash_tensor unchanged."""
    t = torch.randn(8).view(torch.int32)
    swapped = t.clone()
    swapped[[0, 1]] = t[[1, 0]]
    assert torch.hash_tensor(t) == torch.hash_tensor(swapped)
