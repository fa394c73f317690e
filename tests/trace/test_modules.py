"""ModulePaths (the module running each op: path, call index, class, inplace flag), refuse_opaque,
unique_label and variable_name, on real modules."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import inplace_doctor as ipd
from inplace_doctor.errors import UnsupportedModuleError
from inplace_doctor.trace.places import modules as modules_module
from inplace_doctor.trace.places.modules import ModulePaths, named_modules, refuse_opaque, unique_label, variable_name

GLOBAL_NET = nn.Linear(2, 2)


class Block(nn.Module):
    """A residual block: Linear, the skip add (in the block itself), an in-place ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.fc(x) + x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x))


class SharedAct(nn.Module):
    """One ReLU module called twice in a forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc2(self.act(self.fc1(x))))


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.neg()
        raise ValueError("boom")


class Recorder(TorchDispatchMode):
    """Records (op packet name, paths.current) for every aten op, as the tracer reads it."""

    def __init__(self, paths: ModulePaths) -> None:
        super().__init__()
        self.paths = paths
        self.seen: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append((str(func.overloadpacket), self.paths.current))
        return func(*args, **(kwargs or {}))

    def contexts(self, op: str) -> list[Any]:
        return [ctx for name, ctx in self.seen if name == op]


def trace(model: nn.Module, *calls: torch.Tensor, prefix: str = "") -> Recorder:
    """Run `model` on each input under a fresh ModulePaths rooted at `model`."""
    paths = ModulePaths()
    paths.add_root(model, prefix)
    with paths, Recorder(paths) as rec:
        for x in calls:
            model(x)
    return rec


def global_hook_counts() -> tuple[int, int]:
    mm = torch.nn.modules.module
    return len(mm._global_forward_pre_hooks), len(mm._global_forward_hooks)


# --- ModulePaths: path, call index, class, inplace flag -------------------------------------------


def test_paths_of_nested_modules():
    rec = trace(Net(), torch.randn(2, 4))
    assert rec.contexts("aten.relu_") == [("layer.0.relu", 1, "ReLU", True), ("layer.1.relu", 1, "ReLU", True)]
    # the residual add runs in the block itself, not in a child
    assert rec.contexts("aten.add") == [("layer.0", 1, "Block", None), ("layer.1", 1, "Block", None)]
    assert rec.contexts("aten.addmm") == [
        ("layer.0.fc", 1, "Linear", None),
        ("layer.1.fc", 1, "Linear", None),
        ("head", 1, "Linear", None),
    ]


def test_ops_outside_any_module_have_no_context():
    model = Net()
    paths = ModulePaths()
    paths.add_root(model)
    with paths, Recorder(paths) as rec:
        x = torch.ones(2, 4)
        model(x).sum()
    assert rec.contexts("aten.ones") == [None] and rec.contexts("aten.sum") == [None]


def test_the_root_itself_is_the_empty_path():
    rec = trace(Block(), torch.randn(2, 4))
    assert rec.contexts("aten.add") == [("", 1, "Block", None)]


def test_a_prefix_names_the_root_and_its_children():
    rec = trace(Block(), torch.randn(2, 4), prefix="G")
    assert rec.contexts("aten.add") == [("G", 1, "Block", None)]
    assert rec.contexts("aten.relu_") == [("G.relu", 1, "ReLU", True)]


def test_call_index_of_a_module_called_twice():
    rec = trace(SharedAct(), torch.randn(2, 4))
    assert rec.contexts("aten.relu") == [("act", 1, "ReLU", False), ("act", 2, "ReLU", False)]
    assert [ctx[:2] for ctx in rec.contexts("aten.addmm")] == [("fc1", 1), ("fc2", 1)]


def test_call_index_restarts_with_each_outermost_call():
    x = torch.randn(2, 4)
    rec = trace(SharedAct(), x, x)
    assert [ctx[1] for ctx in rec.contexts("aten.relu")] == [1, 2, 1, 2]


def test_inplace_flag():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True), nn.ReLU(), nn.Dropout(0.5, inplace=True))
    rec = trace(model, torch.randn(3, 2))
    by_path = {ctx[0]: ctx[3] for _, ctx in rec.seen if ctx is not None}
    assert by_path["0"] is None  # Linear has no inplace flag
    assert by_path["1"] is True
    assert by_path["2"] is False
    assert by_path["3"] is True


def test_a_module_never_added_is_named_by_the_users_variable():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    paths = ModulePaths()  # no add_root: the paths learn the module at its first call
    with paths, Recorder(paths) as rec:
        net(torch.randn(1, 2))
    assert rec.contexts("aten.relu_") == [("net.1", 1, "ReLU", True)]
    assert rec.contexts("aten.addmm") == [("net.0", 1, "Linear", None)]


def test_a_module_never_added_and_bound_to_two_names_is_named_by_its_class():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    alias = net
    paths = ModulePaths()
    with paths, Recorder(paths) as rec:
        alias(torch.randn(1, 2))
    assert rec.contexts("aten.relu_") == [("Sequential.1", 1, "ReLU", True)]


def test_two_unnamed_modules_of_one_class_get_distinct_paths():
    paths = ModulePaths()
    with paths, Recorder(paths) as rec:
        for m in (nn.Sequential(nn.ReLU(inplace=True)), nn.Sequential(nn.ReLU(inplace=True))):
            m(torch.randn(2))  # bound to the loop variable only, which names no module
    assert [ctx[0] for ctx in rec.contexts("aten.relu_")] == ["Sequential.0", "Sequential#2.0"]


def test_a_loop_variable_names_no_module_the_list_it_runs_over_does():
    models = [nn.Sequential(nn.ReLU(inplace=True)), nn.Sequential(nn.ReLU(inplace=True))]
    paths = ModulePaths()
    with paths, Recorder(paths) as rec:
        for m in models:
            m(torch.randn(2))
    assert [ctx[0] for ctx in rec.contexts("aten.relu_")] == ["models[0].0", "models[1].0"]


class FlowStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.scale(x)) + x


class Flow:
    """Steps kept in a plain list by a plain object (no nn.Module around them), run in a loop."""

    def __init__(self) -> None:
        self.steps = [FlowStep(), FlowStep()]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for s in self.steps:
            x = s(x)
        return x


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qf1, self.qf2 = nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.minimum(self.qf1(x), self.qf2(x))


class SoftActorCritic:
    """An online critic and its target of one class, held by a plain trainer object (SAC's shape)."""

    def __init__(self) -> None:
        self.critic = Critic()
        self.critic_target = Critic()

    def update(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.critic_target(obs)  # the target first: the online critic is the second Critic seen
        return self.critic(obs) - target


class SelfCaller(nn.Module):
    """A module whose own method calls it (`self(x)`): `self` there names no particular module."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)


def test_a_module_called_by_its_own_method_is_named_by_the_callers_variable_not_self():
    policy = SelfCaller()
    paths = ModulePaths()
    with paths, Recorder(paths) as rec:
        policy.predict(torch.randn(2, 4))
    assert [ctx[0] for ctx in rec.contexts("aten.addmm")] == ["policy.fc"]


def test_modules_in_a_plain_objects_list_are_named_by_the_path_not_by_the_loop_variable():
    flow = Flow()
    paths = ModulePaths()
    with paths, Recorder(paths) as rec:
        flow(torch.randn(2, 4))
    assert [ctx[0] for ctx in rec.contexts("aten.addmm")] == ["flow.steps[0].scale", "flow.steps[1].scale"]


def test_modules_of_one_class_held_by_the_users_object_are_named_by_its_attributes():
    trainer = SoftActorCritic()
    paths = ModulePaths()
    with paths, Recorder(paths) as rec:
        trainer.update(torch.randn(2, 4))
    assert [ctx[0] for ctx in rec.contexts("aten.addmm")] == [
        "trainer.critic_target.qf1", "trainer.critic_target.qf2", "trainer.critic.qf1", "trainer.critic.qf2",
    ]


def test_no_hooks_left_behind_after_exit():
    before = global_hook_counts()
    model = Net()
    paths = ModulePaths()
    paths.add_root(model)
    with paths:
        assert global_hook_counts() == (before[0] + 1, before[1] + 1)
        model(torch.randn(2, 4))
    assert global_hook_counts() == before
    with Recorder(paths) as rec:  # the paths no longer follow modules
        model(torch.randn(2, 4))
    assert paths.current is None and paths.current_module() is None
    assert [ctx for _, ctx in rec.seen] == [None] * len(rec.seen) and rec.seen


def test_no_hooks_left_behind_after_an_exception():
    before = global_hook_counts()
    with pytest.raises(ValueError, match="boom"), ModulePaths():
        Boom()(torch.randn(2))
    assert global_hook_counts() == before


def test_an_exception_leaves_the_failing_module_until_cleared():
    model = nn.Sequential(nn.Linear(2, 2), Boom())
    paths = ModulePaths()
    paths.add_root(model)
    with paths:
        with pytest.raises(ValueError):
            model(torch.randn(1, 2))
        assert paths.current == ("1", 1, "Boom", None)
        assert paths.current_module() is model[1]
        paths.clear()
        assert paths.current is None and paths.current_module() is None
        with pytest.raises(ValueError):
            model(torch.randn(1, 2))
    assert paths.current is None  # exit clears too


def test_reentering_after_an_exception_restarts_the_stack():
    model = nn.Sequential(nn.ReLU(), Boom())
    paths = ModulePaths()
    paths.add_root(model)
    with paths, Recorder(paths) as rec:
        for _ in range(2):
            with pytest.raises(ValueError):
                model(torch.randn(2))
    # the second call is call 1 again, at the same depth: the stale stack was dropped
    assert rec.contexts("aten.relu") == [("0", 1, "ReLU", False), ("0", 1, "ReLU", False)]
    assert len(paths._stack) == 0


def test_current_module_while_running():
    model = Net()
    seen: list[Any] = []
    paths = ModulePaths()
    paths.add_root(model)
    model.head.register_forward_pre_hook(lambda m, args: seen.append(paths.current_module()))
    with paths:
        model(torch.randn(2, 4))
    assert seen == [model.head]


def test_on_top_level_sees_each_outermost_call_and_its_return():
    model = Net()
    calls: list[tuple[Any, Any, Any]] = []
    paths = ModulePaths()
    paths.add_root(model)
    paths.on_top_level = lambda module, args, kwargs: calls.append((module, args, kwargs))
    x = torch.randn(2, 4)
    with paths:
        model(x)
        model.head(x)
    assert [(m, a is None) for m, a, _ in calls] == [
        (model, False), (model, True), (model.head, False), (model.head, True)
    ]
    assert calls[0][1][0] is x and calls[0][2] == {} and calls[1][2] is None


def test_on_top_level_sees_the_keyword_arguments_global_pre_hooks_are_not_given():
    class Keywords(nn.Module):
        def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
            return x * scale

    model = Keywords()
    calls: list[tuple[Any, Any, Any]] = []
    paths = ModulePaths()
    paths.on_top_level = lambda module, args, kwargs: calls.append((module, args, kwargs))
    x, scale = torch.randn(2), torch.randn(2)
    with paths:
        model(x, scale=scale)
        model(x=x, scale=scale)
    assert calls[0][1][0] is x and list(calls[0][2]) == ["scale"] and calls[0][2]["scale"] is scale
    assert calls[2][1] == () and calls[2][2]["x"] is x and calls[2][2]["scale"] is scale


# --- ModulePaths: names of modules, parameters and buffers ---------------------------------------


def test_path_of_known_and_unseen_modules():
    model = Net()
    paths = ModulePaths()
    paths.add_root(model)
    assert paths.path_of(model) == "model"
    assert paths.path_of(model.layer[0].relu) == "model.layer.0.relu"
    assert paths.path_of(nn.Linear(1, 1)) == "Linear"


def test_path_of_a_labelled_root_uses_its_label():
    D = nn.Sequential(nn.Linear(2, 2))
    paths = ModulePaths()
    paths.add_root(D, "D")
    assert paths.path_of(D) == "D"
    assert paths.path_of(D[0]) == "D.0"


def test_path_of_the_unnamed_root_uses_the_root_label_watch_was_given():
    net = nn.Sequential(nn.Linear(2, 2))
    paths = ModulePaths()
    paths.root_label = "policy"  # watch(policy=net)
    paths.add_root(net)
    assert paths.path_of(net) == "policy" and paths.path_of(net[0]) == "policy.0"


def test_add_root_does_not_rename_a_known_module():
    model = Net()
    paths = ModulePaths()
    paths.add_root(model)
    paths.add_root(model.layer, "L")
    assert paths.path_of(model.layer[1]) == "model.layer.1"


def test_state_name_of_parameters_and_their_data():
    model = Net()
    paths = ModulePaths()
    paths.add_root(model)
    weight = model.layer[1].fc.weight
    assert paths.state_name(weight) == "layer.1.fc.weight"
    assert paths.state_name(weight.data) == "layer.1.fc.weight"
    assert paths.state_name(model.state_dict()["head.bias"]) == "head.bias"
    assert paths.state_name(torch.zeros(4, 4)) is None


def test_state_name_under_a_prefix_and_of_buffers():
    D = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    paths = ModulePaths()
    paths.add_root(D, "D")
    assert paths.state_name(D[0].weight) == "D.0.weight"
    assert paths.state_name(D[1].running_mean) == "D.1.running_mean"


def test_state_name_forgets_a_rebound_parameter():
    model = nn.Linear(2, 2)
    paths = ModulePaths()
    paths.add_root(model)
    old = model.weight.data
    assert paths.state_name(old) == "weight"
    model.weight.data = torch.zeros(2, 2)
    assert paths.state_name(old) is None


def test_buffer_ids_are_the_known_modules_buffers():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    paths = ModulePaths()
    paths.add_root(model)
    bn = model[1]
    assert paths.buffer_ids() == {id(bn.running_mean), id(bn.running_var), id(bn.num_batches_tracked)}


# --- refuse_opaque --------------------------------------------------------------------------------


def scripted(module: nn.Module) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated in recent torch
        return torch.jit.script(module)


def test_refuse_opaque_on_a_scripted_module():
    with pytest.raises(UnsupportedModuleError) as info:
        refuse_opaque(scripted(nn.Linear(2, 2)), "the model")
    message = str(info.value)
    assert message.startswith("the model is a TorchScript module")
    assert "pass the original nn.Module instead of torch.jit.script/trace output" in message
    assert isinstance(info.value, TypeError)


def test_refuse_opaque_on_a_traced_module():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(UnsupportedModuleError, match="TorchScript"):
        refuse_opaque(traced, "the model")


def test_a_compiled_module_is_accepted_and_named_as_the_module_it_wraps():
    net = Net()
    compiled = torch.compile(net)  # wrapping only: nothing compiles before a call
    assert refuse_opaque(compiled, "the model") is None  # it runs eagerly while traced
    paths = ModulePaths()
    paths.add_root(compiled)
    assert paths.path_of(compiled) == paths.path_of(net) == "model"
    for name, sub in net.named_modules():
        assert paths.path_of(sub) == ("model." + name if name else "model")


def test_refuse_opaque_accepts_plain_modules():
    for module in (nn.Linear(2, 2), nn.ReLU(inplace=True), nn.Sequential(Block()), Net()):
        assert refuse_opaque(module, "the model") is None


def test_a_scripted_module_met_while_running_is_recorded_not_refused():
    paths = ModulePaths()
    inner = scripted(nn.Linear(2, 2))
    with paths:
        inner(torch.randn(1, 2))  # a correct program: it runs on, and the report will say what was not seen
    assert paths.scripted == ["Linear"]


# --- unique_label ---------------------------------------------------------------------------------


def test_unique_label():
    assert unique_label("Sequential", set()) == "Sequential"
    assert unique_label("Sequential", {"Sequential"}) == "Sequential#2"
    assert unique_label("Sequential", {"Sequential", "Sequential#2"}) == "Sequential#3"
    taken = {"D"}
    unique_label("D", taken)
    assert taken == {"D"}  # the caller records the label


# --- variable_name --------------------------------------------------------------------------------


def name_of(module: nn.Module) -> str | None:
    """An API function called by user code, as `watch(G, D)` calls variable_name."""
    return variable_name(module)


def test_variable_name_of_a_local():
    generator = nn.Linear(2, 2)
    assert name_of(generator) == "generator"


def test_variable_name_of_a_global():
    assert name_of(GLOBAL_NET) == "GLOBAL_NET"


def test_variable_name_ignores_private_names():
    _hidden = model = nn.Linear(2, 2)
    assert _hidden is model
    assert name_of(model) == "model"


def test_variable_name_skips_a_loop_variable_for_the_path_it_came_from():
    nets = {"g": nn.Linear(2, 2)}
    for net in nets.values():
        assert name_of(net) == "nets['g']"


def test_variable_name_ambiguous_or_unbound():
    a = b = nn.Linear(2, 2)
    assert a is b
    assert name_of(a) is None
    assert name_of(nn.Linear(2, 2)) is None


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.sigmoid(self.fc(x))) * 2  # the `* 2` saves nothing: the recompute stops before it


class _Checkpointed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block, self.head = _Block(), torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(-1, 1)  # the caller's batch, written in place: IPD106 on every call
        return self.head(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))


def test_a_recompute_that_stops_early_leaves_no_module_on_the_stack() -> None:
    """Non-reentrant checkpoint stops its recompute once backward has what it needs, unwinding past
    the post hooks of the modules it was in (`block`, `block.fc2`). They were left on the stack:
    the optimizer's writes were then "in block.fc2", and the next forward was not a top-level call,
    so its writes into the caller's batch went unreported."""
    torch.manual_seed(0)
    model = _Checkpointed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ipd.watch(model) as session:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            assert session.tracer.modules.current is None
            opt.step()
    [finding] = [f for f in session.findings if f.code == "IPD106"]
    assert finding.count == 2  # the second step's write is seen too


# --- naming cost ----------------------------------------------------------------------------------


class _OwnNames(nn.Sequential):
    """A container whose class lists its modules itself (as some libraries' wrappers do)."""

    def named_modules(self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True) -> Any:
        yield prefix, self
        yield (f"{prefix}.only" if prefix else "only"), self[0]


def test_named_modules_walks_as_pytorch_does_shared_and_nested_modules_once():
    shared = nn.Linear(2, 2)
    tree = nn.ModuleDict({"a": nn.Sequential(shared, nn.ReLU()), "b": shared, "c": nn.ModuleList([nn.Sequential(), shared])})
    tree.c.append(tree.a)  # the same subtree twice: named at its first place only
    own = nn.Sequential(nn.Linear(2, 2), _OwnNames(nn.Linear(2, 2), nn.Tanh()))  # its own names count
    for root in (tree, Net(), nn.TransformerEncoderLayer(8, 2, batch_first=True), own):
        assert [(n, id(m)) for n, m in named_modules(root)] == [(n, id(m)) for n, m in root.named_modules()]


def test_a_watch_held_over_many_steps_names_the_model_once(monkeypatch):
    asked: list[nn.Module] = []

    def counted(module: nn.Module) -> str | None:
        asked.append(module)
        return variable_name(module)

    monkeypatch.setattr(modules_module, "variable_name", counted)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 1))
    with ipd.watch() as session:
        for _ in range(5):
            model(torch.randn(2, 4)).sum().backward()
    assert asked == [model]  # at its first call: its children are named from it, then known
    assert session.findings == []
