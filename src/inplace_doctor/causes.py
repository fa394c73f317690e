"""What a rule decided, as data (records): a cause per rule, the facts it measured, the roles of its sites.

A rule picks one member of its cause enum and fills one frozen facts record; render/'s
explanation module turns (code, cause, facts, sites) into English. Later code (the
dispatcher, the renderers, the exit codes, IPD108 confirming its own earlier finding)
decides on these fields, never on the wording of a sentence.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from .sites import Site
from .sites import WriteForm as WriteForm  # lives with Site, named here too, as before

#: the metadata of a facts field that only a sentence reads (kept out of the JSON's `details`)
WORDS_ONLY = {"words_only": True}


class SiteRole(enum.StrEnum):
    """What a site of a finding is to it."""

    WRITE = "write"              # the in-place write (`Finding.mutation`)
    SAVE = "save"                # the op that saved the tensor for backward (`Finding.saved`)
    READ = "read"                # the later op that read or used the written tensor (`Finding.read`)
    VIEWS_MADE = "views-made"    # the line that made the views one of which was written (`Finding.read`, IPD103)
    CONSTRUCTOR = "constructor"  # where the module with the `inplace` flag was constructed


class Unreached(enum.StrEnum):
    """Why a prediction ended unconfirmed: what kept backward from reaching its tensor. Its words:
    render/explain/unreached.py. A warning when the run could not tell (backward stopped at an
    error, or never ran); info when a backward ran and its tensor is not on its path."""

    STOPPED_AT_INPLACE_ERROR = "stopped-at-inplace-error"  # backward stopped at an earlier in-place error
    STOPPED_AT_ERROR = "stopped-at-error"  # backward stopped at another error raised inside backward
    FORWARD_STOPPED = "forward-stopped"  # audit's forward raised before backward
    NO_BACKWARD = "no-backward"  # audit ran the forward only
    NOT_ON_LOSS_PATH = "not-on-loss-path"  # audit's backward ran to the end without reaching it
    NOT_REACHED_IN_WATCH = "not-reached-in-watch"  # no backward reached it while watch() was active
    PENDING = "pending"  # read while the watch is open: no backward has reached it yet


class SavedTensorCause(enum.StrEnum):
    """IPD101."""

    OVERWRITTEN = "overwritten"                  # a write the tracer saw bumped the saved tensor's version
    ALSO_WRITTEN = "also-written"                # an earlier write to the same saved tensor, confirmed with the last one
    WRITE_NOT_SEEN = "write-not-seen"            # backward found it stale; the write was outside the watched code
    RAISED_BEFORE_WATCH = "raised-before-watch"  # only PyTorch's own check saw it (saved before watch() began)


class SilentOverwriteCause(enum.StrEnum):
    """IPD104: how the write got past the version counter."""

    NO_VERSION_BUMP = "no-version-bump"  # an op that bumps no version counter at all (`set_`)
    DATA_ALIAS = "data-alias"            # through `.data`
    OTHER_ALIAS = "other-alias"          # an alias with its own version counter (`from_numpy` twins, storage views)


class LeafCause(enum.StrEnum):
    """IPD102."""

    LEAF = "leaf"
    VIEW_OF_LEAF = "view-of-leaf"


class ForbiddenCause(enum.StrEnum):
    """IPD103: which in-place error PyTorch raised at the op."""

    EXPANDED = "expanded"
    HOOKED_OUTPUT = "hooked-output"
    MULTIPLE_VIEWS = "multiple-views"
    NO_GRAD_VIEW = "no-grad-view"
    CUSTOM_FUNCTION_VIEW = "custom-function-view"


class ChangedResultCause(enum.StrEnum):
    """IPD105: what made the write in place."""

    FLAG = "flag"            # an `inplace=True` module or call
    AUGMENTED = "augmented"  # `x += y`


class CallerDataCause(enum.StrEnum):
    """IPD106 and IPD107."""

    CALLER_INPUT = "caller-input"          # IPD106: the model call's argument written
    HELD_ALIAS_USED = "held-alias-used"    # IPD107: a state_dict() alias, overwritten, then used
    HELD_ALIAS_OVERWRITTEN = "held-alias-overwritten"  # IPD107: overwritten and still held, not used in the watched code


class SideEffectCause(enum.StrEnum):
    """IPD108."""

    REPEATED = "repeated"                  # state changed again by a checkpoint's recompute
    CHECKPOINT_INPUT = "checkpoint-input"  # a checkpointed region writes its own saved input in place


class OutsideWriteCause(enum.StrEnum):
    """IPD109: what the tool saw of the write outside PyTorch."""

    WRITE_SEEN = "write-seen"    # the writing line (checked line by line)
    HANDED_OUT = "handed-out"    # only the line that handed the memory out
    UNSEEN = "unseen"            # neither (found by `check_contents`)


class GraphHistoryCause(enum.StrEnum):
    """IPD110: how the write escaped autograd."""

    DETACH = "detach"
    DATA = "data"
    NO_GRAD = "no_grad"
    INFERENCE_MODE = "inference_mode"


class RecomputeCause(enum.StrEnum):
    """IPD111: why the recompute differed."""

    RNG = "rng"            # a random op drew other numbers
    STATE = "state"        # a tensor it reads was written between forward and recompute
    UNKNOWN = "unknown"    # nothing the tracer saw: a nondeterministic kernel or an unseen write
    SAVED_BEFORE_WRITE = "saved-before-write"  # the recompute stopped before a kernel wrote what it saved


Cause = (
    SavedTensorCause | SilentOverwriteCause | LeafCause | ForbiddenCause | ChangedResultCause | CallerDataCause
    | SideEffectCause | OutsideWriteCause | GraphHistoryCause | RecomputeCause
)


@dataclass(frozen=True)
class VersionFacts:
    """IPD101/IPD104: the saved tensor's version when saved, and when written (None when not known).

    For the sentences: the node holding the saved tensor, the written and the saved shapes (a
    `Linear` saves its weight transposed), the written dtype, and the backward that confirmed it
    (its user line). An earlier write confirmed with the last (`SavedTensorCause.ALSO_WRITTEN`)
    also holds the last write's facts (`then`) and place (`then_at`), and whether the writes were
    parameter updates (`updates`: none can go to a copy instead)."""

    saved_version: int | None = None
    version_now: int | None = None
    node: str | None = field(default=None, metadata=WORDS_ONLY)
    write_shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    write_dtype: str = field(default="", metadata=WORDS_ONLY)
    saved_shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    backward: Site | None = field(default=None, metadata=WORDS_ONLY)
    then: VersionFacts | None = field(default=None, metadata=WORDS_ONLY)
    then_at: str = field(default="", metadata=WORDS_ONLY)
    updates: bool = field(default=False, metadata=WORDS_ONLY)
    #: the write bumped the counter the saved tensor shares but changed none of its saved elements
    counter_only: bool = field(default=False, metadata=WORDS_ONLY)


@dataclass(frozen=True)
class DifferenceFacts:
    """IPD105: the largest difference between what the later op read and the original (inf, NaN: see the
    rule); the overwritten tensor's shape and dtype, for the sentences."""

    max_difference: float
    shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    dtype: str = field(default="", metadata=WORDS_ONLY)
    #: the read was of another object over the same memory, made before the write (`h[:, :4]`, `h.detach()`)
    through_alias: bool = field(default=False, metadata=WORDS_ONLY)


@dataclass(frozen=True)
class ArgumentFacts:
    """IPD106: which argument of the model call was written (`args[0]`, `kwargs['x']`); the written
    tensor's shape and dtype, for the sentences."""

    argument: str
    shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    dtype: str = field(default="", metadata=WORDS_ONLY)


@dataclass(frozen=True)
class HeldFacts:
    """IPD107: the state_dict() entry held, and where the dict was handed out; for the sentences,
    the handing-out line's text and how the alias was used (`loaded with load_state_dict`)."""

    held: str
    handed_out: str
    code: str = field(default="", metadata=WORDS_ONLY)
    used_how: str = field(default="", metadata=WORDS_ONLY)


@dataclass(frozen=True)
class SideEffectFacts:
    """IPD108: what changed a second time (`BatchNorm running statistics`)."""

    what_changed: str


class WriteLineSearch(enum.StrEnum):
    """IPD109: how the line that wrote a saved tensor outside PyTorch was looked for, and what came of it."""

    NOT_SEARCHED = "not-searched"  # no line checks ran (no `check_contents`, and the run was not replayed)
    HANDOUT_FRAME = "hand-out-frame"  # the frame that handed the memory out was checked line by line
    LINE = "line"  # a replay of the run checked every user line and found it
    NOT_SAVED_AGAIN = "not-saved-again"  # the replay saved no tensor at its place: the run did not repeat
    OTHER_BYTES = "other-bytes"  # the replay saved it with other bytes: the run is not deterministic
    NO_CHANGE = "no-change"  # the replay saved the same bytes and no user line changed them
    BUDGET = "budget"  # the replay's line budget ran out first
    TRACED = "traced"  # another trace function (a debugger, coverage) was set: the replay did not search
    FAILED = "failed"  # the replay raised before the tensor was saved again
    NO_LATER_STEP = "no-later-step"  # `run`: no watched step followed the one that found the change


@dataclass(frozen=True)
class HandOutFacts:
    """IPD109: where and how the memory was handed out of PyTorch; for the sentences, the hand-out's
    line (`in_source`: it has a file and line; `code`: its text) and the saved tensor as it was
    saved (shape, dtype, version, the node holding it)."""

    handed_out: str | None
    how: str | None
    in_source: bool = field(default=False, metadata=WORDS_ONLY)
    code: str = field(default="", metadata=WORDS_ONLY)
    shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    dtype: str = field(default="", metadata=WORDS_ONLY)
    saved_version: int = field(default=0, metadata=WORDS_ONLY)
    node: str | None = field(default=None, metadata=WORDS_ONLY)
    search: WriteLineSearch = field(default=WriteLineSearch.NOT_SEARCHED, metadata=WORDS_ONLY)
    method: str | None = field(default=None, metadata=WORDS_ONLY)  # "numpy", "__dlpack__", ...: `how`'s method
    #: `run`: the later watched steps (first, last) whose line checks looked for the writing line; with
    #: `search` LINE, (k, k): found on step k
    search_steps: tuple[int, int] | None = field(default=None, metadata=WORDS_ONLY)


@dataclass(frozen=True)
class HistoryFacts:
    """IPD110: the tensor's history (`the output of relu`), empty when unnamed; once backward ran
    through the use, of the `written` elements (None: not known) how many got non-zero gradient; for
    the sentences, the written tensor's shape and dtype and whether the write was `t[mask] = v` with
    one boolean mask."""

    history: str
    nonzero_gradient: int | None = None
    written: int | None = None
    shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    dtype: str = field(default="", metadata=WORDS_ONLY)
    boolean_mask: bool = field(default=False, metadata=WORDS_ONLY)


@dataclass(frozen=True)
class RecomputeFacts:
    """IPD111: which op of the region (1-based) first differed; for the sentences, what the rule
    decided on: the region's preserve_rng_state (None: not known), the write after forward to a
    tensor the op reads (`write`: its site; its target, shape and dtype; whether the region itself
    made it), whether such a tensor's version changed with no write seen, and whether the op ran
    with nondeterministic kernels allowed."""

    position: int
    rng_preserved: bool | None = field(default=None, metadata=WORDS_ONLY)
    write: Site | None = field(default=None, metadata=WORDS_ONLY)
    write_target: str | None = field(default=None, metadata=WORDS_ONLY)
    write_shape: tuple[int, ...] = field(default=(), metadata=WORDS_ONLY)
    write_dtype: str = field(default="", metadata=WORDS_ONLY)
    write_in_region: bool = field(default=False, metadata=WORDS_ONLY)
    input_version_changed: bool = field(default=False, metadata=WORDS_ONLY)
    nondeterministic_kernels: bool = field(default=False, metadata=WORDS_ONLY)
    # saved-before-write (`F.rrelu`'s noise): the `checkpoint` call, the written argument (its shape
    # and dtype in `write_shape`/`write_dtype`), its first values as the forward's kernel wrote them
    # and as the recompute saved them, and where the saved value came from
    checkpoint_call: Site | None = field(default=None, metadata=WORDS_ONLY)
    argument: str = field(default="", metadata=WORDS_ONLY)
    written_values: tuple[float, ...] = field(default=(), metadata=WORDS_ONLY)
    saved_values: tuple[float, ...] = field(default=(), metadata=WORDS_ONLY)
    uninitialised: bool = field(default=False, metadata=WORDS_ONLY)
    outside: bool = field(default=False, metadata=WORDS_ONLY)


@dataclass(frozen=True)
class RaisedFacts:
    """IPD103: PyTorch's own message (its first line), and where backward was called and the node
    it raised in, when it raised inside backward. IPD101 (a stale saved tensor PyTorch alone saw):
    the saving node and the saved tensor's shape its message names (`node`, `shape`)."""

    error: str = field(metadata=WORDS_ONLY)
    node: str | None = field(default=None, metadata=WORDS_ONLY)
    backward_called_at: str | None = field(default=None, metadata=WORDS_ONLY)
    shape: str | None = field(default=None, metadata=WORDS_ONLY)


Facts = (
    VersionFacts | DifferenceFacts | ArgumentFacts | HeldFacts | SideEffectFacts | HandOutFacts | HistoryFacts
    | RecomputeFacts | RaisedFacts
)


def cause_of(value: str) -> Cause:
    """The cause member whose value is `value` (values are unique across the rules' enums)."""
    for kind in typing.get_args(Cause):
        try:
            return kind(value)  # type: ignore[no-any-return]
        except ValueError:
            continue
    raise ValueError(f"no rule's cause is {value!r}")


def facts_to_dict(facts: Facts) -> dict[str, Any]:
    """A facts record as JSON data, every field (its type named, so `facts_from_dict` rebuilds it)."""
    return {"type": type(facts).__name__, **{f.name: _plain(getattr(facts, f.name)) for f in fields(facts)}}


def facts_from_dict(data: Mapping[str, Any]) -> Facts:
    """The facts record `facts_to_dict` wrote."""
    kinds = {kind.__name__: kind for kind in typing.get_args(Facts)}
    kind = kinds[data["type"]]
    hints = typing.get_type_hints(kind, {**globals(), "Site": Site})
    return kind(**{f.name: _typed(hints[f.name], data[f.name]) for f in fields(kind) if f.name in data})  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    if isinstance(value, Site):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return facts_to_dict(value)  # type: ignore[arg-type]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _typed(hint: Any, value: Any) -> Any:
    """`value` (JSON data) as the field typed `hint` holds it: sites, facts, enums and tuples rebuilt."""
    if value is None:
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _typed(args[0], value) if len(args) == 1 else value
    if hint is Site:
        return Site.from_dict(value)
    if isinstance(value, Mapping) and "type" in value:
        return facts_from_dict(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if typing.get_origin(hint) is tuple:
        return tuple(_typed(args[0], v) if args else v for v in value)
    return value
