"""What the tracer observed. Frozen records that flow one way: tracer -> analysis."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .causes import WriteLineSearch as WriteLineSearch  # a record of the IPD109 facts too
from .sites import Site


class SavedBy(enum.Enum):
    """What the tracer knows of the op that saved a tensor, set where it names the save."""

    OP = enum.auto()  # an op or autograd node it saw: the site's op names it
    CHECKPOINT = enum.auto()  # torch.utils.checkpoint itself, for its region's inputs (a node never named)
    UNKNOWN = enum.auto()  # neither: the site's op is a placeholder, never "the output of" it


@dataclass(frozen=True)
class SavedInfo:
    """A tensor autograd saved for backward, as it was when saved."""

    site: Site
    node: str | None  # autograd node holding it: "SigmoidBackward0"
    field: str | None  # the node's field: "result", "mat2", "saved_tensors[0]"
    version: int  # the tensor's version when saved: what backward will expect
    shape: tuple[int, ...]
    dtype: str
    read_by_backward: bool  # False for fields the node's backward never reads
    key: int  # stable id of this saved tensor within one tracer
    in_checkpoint: bool = False  # saved inside a checkpointed region (its forward or recompute)
    saved_by: SavedBy = SavedBy.OP

    @property
    def is_checkpoint_input(self) -> bool:
        """Saved by torch.utils.checkpoint itself for its region (its inputs), not by code inside the region."""
        api = (self.site.api or "").rsplit(".", 1)[-1]
        return not self.in_checkpoint or api in ("checkpoint", "checkpoint_sequential") or (
            self.node in ("CheckpointFunctionBackward", "_NoopSaveInputsBackward")
        )

    @property
    def slot(self) -> str:
        if self.node is None:
            if self.saved_by is SavedBy.CHECKPOINT:
                return "the input of the checkpointed region"
            return f"the output of {self.site.op}" if self.saved_by is SavedBy.OP else "a saved tensor"
        return f"{self.node}.{self.field}" if self.field else self.node


@dataclass(frozen=True)
class WriteInfo:
    """An op that wrote into a tensor's memory."""

    site: Site
    shape: tuple[int, ...]
    dtype: str
    writes_bytes: bool  # False for metadata-only in-place ops (squeeze_, t_, set_)
    in_checkpoint: bool = False  # inside a torch.utils.checkpoint region (forward or recompute)
    target: str | None = None  # the parameter or buffer written, by qualified name: "D.2.weight"


@dataclass(frozen=True)
class SavedTensorOverwritten:
    """A write changed a tensor that autograd had saved for backward.

    `shares_version_counter` tells how: True when the write bumped the saved
    tensor's version (autograd will notice and raise at backward), False when
    it changed the saved bytes through an alias with its own counter (`.data`,
    `set_`, storage sharing): backward will silently read the new values.
    """

    write: WriteInfo
    saved: SavedInfo
    version_now: int
    shares_version_counter: bool
    already_used_by_backward: bool
    write_bumped_a_version: bool = True  # False: the op bumps no counter at all (fused optimizers)
    #: False: the write bumped the counter the saved tensor shares (another row of its base, a
    #: metadata-only op) without touching an element it saved; autograd raises all the same
    saved_elements_written: bool = True


@dataclass(frozen=True)
class StaleSavedTensorUsed:
    """Backward reached a saved tensor whose version no longer matches: it raises."""

    saved: SavedInfo
    node: str | None
    version_now: int
    #: keys of the predicted saved tensors in the graph of the backward that raised, not reached
    #: because it stopped here; None when its graph was not found (all pending ones may be)
    stopped_before: frozenset[int] | None = None


@dataclass(frozen=True)
class SavedTensorReached:
    """Backward unpacked a saved tensor that a write had changed, with its version unchanged:
    it computes with the new values (what an IPD104 prediction said it would)."""

    key: int  # SavedInfo.key of the tensor reached


@dataclass(frozen=True)
class SavedTensorFreed:
    """Autograd released a saved tensor that a write had changed, without backward reading it:
    its graph was freed (never backpropagated, or not through that node). Nothing will raise.
    Also sent when backward reads it holding exactly the bytes it was saved with (a `.data`
    write undone before backward: Lookahead's backup/restore): nothing wrong is computed."""

    key: int


@dataclass(frozen=True)
class InplaceErrorRaised:
    """PyTorch raised an error inside the traced code; rules decide whether it is an in-place one."""

    error: BaseException
    site: Site
    in_checkpoint: bool = False
    #: raised inside backward: the failing node (`CopySlices`) and where forward created it
    node: str | None = None
    created: Site | None = None
    #: raised at an in-place call autograd refused: where the written tensor's autograd node was
    #: created (the `unbind`/`chunk`/`split` that returned it, among several views)
    target_created: Site | None = None
    #: the program caught it and went on (it never left the watched code): `error` is a copy of
    #: PyTorch's, without its traceback, made where the call raised
    caught: bool = False


@dataclass(frozen=True)
class CallerInputWritten:
    """Code inside a model wrote into a tensor its caller passed in."""

    write: WriteInfo
    argument: str  # "args[0]", "kwargs['mask']", "argument 0 of ResNet"
    read: Site | None = None  # a write the call's own `inplace=True` asked for: the caller's first read after it


@dataclass(frozen=True)
class OriginalValueRead:
    """A forward op read an object an in-place call overwrote: out of place, it would have read the original."""

    write: WriteInfo  # the in-place call (module flag, inplace=True argument, augmented assignment)
    read: Site  # the op that read the old object
    kind: str  # "flag" or "augmented"
    max_difference: float  # between what it read and the original values, on this input
    through_alias: bool = False  # it read a view or detach() of the tensor made before the write, not the tensor


@dataclass(frozen=True)
class HeldTensorOverwritten:
    """A tensor handed out earlier (a `state_dict()` entry) had its memory overwritten while still held."""

    write: WriteInfo
    held: str  # what holds it: "model.state_dict()['fc.weight']"
    handed_out: Site  # where it was handed out


@dataclass(frozen=True)
class HeldTensorUsed:
    """A handed-out alias that another path overwrote (`HeldTensorOverwritten`) is now used as a
    snapshot: loaded, read by an op, or saved."""

    overwritten: HeldTensorOverwritten
    use: Site  # where it was used: `model.load_state_dict(best)`
    how: str  # "loaded with load_state_dict", "read by `aten.sub`"


@dataclass(frozen=True)
class SideEffectRepeated:
    """During backward (a checkpoint's recompute), state that forward already changed is changed again."""

    write: WriteInfo  # the repeated write, or the batch-norm op whose running-stat update repeats
    what: str  # "a tensor written in forward" or "BatchNorm running statistics"


@dataclass(frozen=True)
class SavedTensorChangedOutside:
    """A saved tensor's bytes changed with its version unchanged and no write the tracer saw: written
    through memory handed out of PyTorch (`.numpy()`, DLPack, `data_ptr()`) or by a kernel that
    declares no write. `reached`: backward unpacked it (it read the new values); else found at a
    checkpoint (the session's end) and not read yet."""

    saved: SavedInfo
    handed_out: Site | None  # the call that handed the memory out, when one was seen
    how: str | None  # "`.numpy()`", "`__dlpack__()`", "`to_dlpack()`", "`.data_ptr()`"
    write: Site | None  # the line that changed the bytes, where line checks found it
    reached: bool
    search: WriteLineSearch = WriteLineSearch.NOT_SEARCHED  # how the writing line was looked for
    method: str | None = None  # what handed the memory out: "numpy", "__dlpack__", "to_dlpack", "data_ptr"
    #: `run`: the later watched steps (first, last) whose line checks looked for the writing line; with
    #: `search` LINE, (k, k): found on step k (None: this run's checks, or a replay's)
    search_steps: tuple[int, int] | None = None


@dataclass(frozen=True)
class CheckpointRecomputeDiffers:
    """A checkpointed region's recompute produced other values than its forward: the first op that differs."""

    site: Site  # the op, at its line inside the region
    position: int  # its place among the region's value-computing ops, from 1
    random: bool  # the op draws random numbers (dropout's bernoulli_, rand*, normal_)
    rng_preserved: bool | None  # the region's preserve_rng_state, when known
    changed_by: WriteInfo | None  # the write, after forward, to a tensor the op reads from outside the region
    input_version_changed: bool  # a tensor the op reads from outside the region has another version now
    #: the op ran on an accelerator with nondeterministic algorithms allowed: atomics (index_add_,
    #: scatter_add_, some convolution and matmul algorithms) may differ in the last bits run to run
    nondeterministic_kernels: bool = False


@dataclass(frozen=True)
class CheckpointSavedBeforeWrite:
    """In a checkpointed region, an op whose kernel writes an argument its node saved before the kernel
    ran (`rrelu_with_noise`'s `noise`): the recompute stopped before the kernel, and what it saved for
    that argument differs from what the forward's kernel wrote."""

    site: Site  # the op, at its line inside the region
    checkpoint_call: Site | None  # the line that called checkpoint
    position: int  # its place among the region's value-computing ops, from 1
    argument: str  # the written argument, by its schema name: "noise"
    shape: tuple[int, ...]
    dtype: str
    written: tuple[float, ...]  # its first values as the forward's kernel wrote them
    saved: tuple[float, ...]  # its first values as the recompute saved them (before the kernel)
    uninitialised: bool  # the region made it with `empty*` (F.rrelu's `empty_like`): garbage until written
    outside: bool  # it comes from outside the region: the recompute saved it as it is at backward


@dataclass(frozen=True)
class GraphTensorChangedOutsideAutograd:
    """A write autograd did not record changed a non-leaf tensor that requires grad (through a
    `.detach()`/`.data` alias, or under `no_grad`/`inference_mode`), and a later op with grad on used
    it: gradients flow back through history that no longer computes its value. A prediction until
    backward runs through the use (`ChangedGraphTensorReached`) or the use's node is freed unread
    (`ChangedGraphTensorFreed`)."""

    write: WriteInfo
    use: Site  # the first op that used the changed tensor with grad on
    how: str  # "detach", "data", "no_grad" or "inference_mode"
    history: str | None  # the changed tensor's autograd node: "AddmmBackward0"
    key: int  # negative, so never a saved tensor's key
    boolean_mask: bool = False  # the write was `t[mask] = v` with one boolean mask


@dataclass(frozen=True)
class ChangedGraphTensorReached:
    """Backward ran the node of the op that used a tensor changed outside autograd (and, where the
    written elements are known, sent non-zero gradient to `nonzero` of the `written` ones)."""

    changed: GraphTensorChangedOutsideAutograd
    nonzero: int | None = None
    written: int | None = None


@dataclass(frozen=True)
class ChangedGraphTensorFreed:
    """Autograd freed the node of that use without backward running it: nothing flowed through it."""

    key: int


@dataclass(frozen=True)
class ChangedGraphTensorHarmless:
    """Backward ran through the use, and the gradient reaching the changed tensor is exactly zero at
    every position the write changed: the gradients equal the out-of-place program's (a `-inf` mask
    before a softmax). Settles the prediction without a finding."""

    key: int


@dataclass(frozen=True)
class BackwardErrorCaught:
    """The program caught the error a backward raised at an overwritten saved tensor (PyTorch's, which
    the tool raised for it) and went on: the findings it confirmed, by `Finding.dedupe_key`."""

    keys: tuple[Any, ...]


Event = (
    SideEffectRepeated
    | SavedTensorOverwritten
    | StaleSavedTensorUsed
    | SavedTensorReached
    | SavedTensorFreed
    | InplaceErrorRaised
    | CallerInputWritten
    | OriginalValueRead
    | HeldTensorOverwritten
    | HeldTensorUsed
    | SavedTensorChangedOutside
    | CheckpointRecomputeDiffers
    | CheckpointSavedBeforeWrite
    | GraphTensorChangedOutsideAutograd
    | ChangedGraphTensorReached
    | ChangedGraphTensorFreed
    | ChangedGraphTensorHarmless
    | BackwardErrorCaught
)
