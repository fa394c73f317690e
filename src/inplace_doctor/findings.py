"""Findings: what a rule concluded, as records; their words are made when asked (`explanations.py`)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .causes import Cause, Facts, SiteRole, Unreached, cause_of, facts_from_dict, facts_to_dict
from .explanations import Sentences, explain, unreached_sentence
from .sites import ROOT_LABEL, Site, caller_frame


class Applicability(enum.StrEnum):
    """How far a fix may be trusted, as ruff's `Applicability`: decided by checking it, never by its wording.

    `proven`: its edits were applied to a scratch copy of the user's program, which then ran
    with the finding gone, no new finding, and forward values, gradients and state equal bit
    for bit to the intended program's (`inplace-doctor fix` applies it). `unsafe`: edits exist
    but are not (or could not be) proven; applied only with `--unsafe-fixes`. `manual`: no edit
    can be made from the source (a change of design); shown, never applied.
    """

    PROVEN = "proven"
    UNSAFE = "unsafe"
    MANUAL = "manual"


@dataclass(frozen=True, order=True)
class Position:
    """A place in a source file: 1-based line (lines end at \\n, \\r\\n or a lone \\r, as Python reads
    source), 0-based column counted in characters of the decoded line (a BOM not counted)."""

    line: int
    column: int

    def to_dict(self) -> dict[str, int]:
        return {"line": self.line, "column": self.column}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Position:
        return cls(int(data["line"]), int(data["column"]))


@dataclass(frozen=True)
class Edit:
    """Replace the text from `start` to `end` (exclusive) of `path`, which reads `old`, by `new`.

    An insertion has `start == end` and `old == ""`. `path` is the file as the finding's sites
    name it (relative to the working directory the run started in, or absolute). Built from the
    source at the site (never from a sentence); applied by splicing, so every other byte of the
    file (line endings, BOM, encoding) stays as it was. `old` and `new` end their lines as the file
    does (`rules/fixes/source.py` `Source.edit`): `old` is the decoded text from `start` to `end` exactly,
    and a line break in `new` is the ending of the line the edit starts on, so the decoded file with
    `new` spliced in, encoded back (its BOM kept), is the bytes `fix` writes. (`fix` also takes
    "\n" where the file has another ending, and writes the file's.)
    """

    path: str
    start: Position
    end: Position
    old: str
    new: str
    #: the file's lines as the builder read them (linecache's text): what a sentence about the edit
    #: quotes, whatever the file holds by the time it is said (`fix` itself edits it)
    source: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def line(self, number: int) -> str:
        """Line `number` of the file as the builder read it ("" past its end or unread)."""
        return self.source[number - 1] if 0 < number <= len(self.source) else ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "start": self.start.to_dict(), "end": self.end.to_dict(), "old": self.old, "new": self.new}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Edit:
        return cls(data["path"], Position.from_dict(data["start"]), Position.from_dict(data["end"]), data["old"], data["new"])


class FixKind(enum.StrEnum):
    """What a fix does to the program; its English is made in render/ from this and its edits."""

    CLONE_BEFORE_WRITE = "clone-before-write"      # `h = h.clone()` before the writing statement
    OUT_OF_PLACE = "out-of-place"                  # `x += y` -> `x = x + y`
    REBIND = "rebind"                              # `x.relu_()` -> `x = x.relu()`
    FLAG_OFF_AT_CONSTRUCTOR = "flag-off-at-constructor"  # `nn.ReLU(inplace=True)` -> `inplace=False`
    FLAG_OFF_AT_CALL = "flag-off-at-call"          # `F.relu(h, inplace=True)` -> `inplace=False`
    MOVE_STATEMENT = "move-statement"              # an optimizer step moved after the backward that reads
    UPDATE_FIRST = "update-first"                  # the later update (zero_grad, backward, step) moved before the step
    COMPUTE_THEN_WRITE = "compute-then-write"      # `v = f(buf[2])`, `buf = buf.clone()`, `buf[4] = v`: the save is in the write
    RECOMPUTE = "recompute-forward"                # run the forward again after the update (manual)
    DETACH_CARRIED = "detach-carried"              # detach what a loop carries into its next step's graph (manual)
    COPY_AT_HANDOUT = "copy-at-handout"            # `t.numpy()` -> `t.numpy().copy()`, a state_dict() snapshot copied
    OTHER = "other"                                # a change no edit expresses (manual)


@dataclass(frozen=True)
class Evidence:
    """What checking a fix on the user's program found: `checked` is False when it was not run."""

    checked: bool = False
    equal: bool = False          # forward values, gradients and state equal the intended program's, bit for bit
    finding_gone: bool = False   # the finding (and its siblings) no longer reported
    new_findings: tuple[str, ...] = ()  # codes of errors/warnings the edited program reports that the original did not
    steps: int = 0               # training steps compared
    first_difference: str = ""   # which value differed first (display only; nothing reads it back)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked, "equal": self.equal, "finding_gone": self.finding_gone,
            "new_findings": list(self.new_findings), "steps": self.steps, "first_difference": self.first_difference,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(
            checked=bool(data.get("checked")), equal=bool(data.get("equal")), finding_gone=bool(data.get("finding_gone")),
            new_findings=tuple(data.get("new_findings", ())), steps=int(data.get("steps", 0)),
            first_difference=str(data.get("first_difference", "")),
        )


@dataclass(frozen=True)
class Fix:
    """One way to fix a finding: its kind, the edits that make it (none for a manual fix), how far
    it may be trusted, and the evidence for that."""

    kind: FixKind
    edits: tuple[Edit, ...] = ()
    applicability: Applicability = Applicability.MANUAL
    evidence: Evidence = Evidence()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "applicability": str(self.applicability),
            "edits": [e.to_dict() for e in self.edits],
            "evidence": self.evidence.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fix:
        """The fix `to_dict` wrote; a kind a newer report names reads as OTHER (its edits still say what it does)."""
        try:
            kind = FixKind(data.get("kind", ""))
        except ValueError:
            kind = FixKind.OTHER
        return cls(
            kind, tuple(Edit.from_dict(e) for e in data.get("edits", ())),
            Applicability(data.get("applicability", "manual")), Evidence.from_dict(data.get("evidence") or {}),
        )


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Finding:
    """One in-place hazard, with the op that overwrote and (when known) the op that saved.

    A record of what the rule decided, and no sentence: `cause` (a member of the rule's enum in
    `causes.py`), `facts` (its frozen facts record), the sites and their roles (`sites`), `fixes`.
    Code that decides reads these. Its English (`what` happened, `why` it matters, the `fix`, and
    `message` joining them: the JSON's and the error's) is made when asked, from these fields, by
    the explainer render/explain/ registered for its rule and cause (`explanations.py`).

    A write to a tensor saved for backward is a prediction until backward reaches that tensor:
    `confirmed` is True when it did (and raised, or read the changed values), False when the run
    ended without it (`unreached` says why, and the severity is lowered), None for what needs no
    confirmation. `count` is how many occurrences were folded into this finding (same lines,
    several layers or steps); `places` names them (a parameter, a module path); `also` holds the
    folded occurrences whose fix differs (a flag to turn off in another module), each a finding
    whose fix is an alternative.
    """

    code: str
    severity: Severity
    title: str
    mutation: Site
    saved: Site | None = None
    confirmed: bool | None = None
    read: Site | None = None  # IPD105: the op that read the overwritten object
    count: int = 1
    places: tuple[str, ...] = ()
    unreached: Unreached | None = None  # when confirmed is False: what kept backward from its tensor
    fixes: tuple[Fix, ...] = ()  # the fix as records
    cause: Cause | None = None  # the rule's cause enum: what render/ explains, what later code decides on
    facts: Facts | None = None  # what the rule measured (versions, a difference, an argument)
    slot: str | None = None  # the saved slot (`SigmoidBackward0.result`) when a saved tensor is involved
    target: str | None = None  # the parameter or buffer written (`layer1.0.weight`), relative to the model
    read_role: SiteRole = SiteRole.READ  # what `read` is: a later read, or the line that made the views
    ranks: tuple[int, ...] = ()  # torch.distributed ranks that reported it (engines/distributed.py)
    also: tuple[Finding, ...] = ()  # folded occurrences whose fix differs: alternatives (per-module flags)
    caught: bool = False  # PyTorch raised it and the program caught the error and went on
    root_label: str = ROOT_LABEL  # what reports call the model its module paths start from ("" for none)

    @property
    def sentences(self) -> Sentences:
        """What happened, why it matters, the fix: made now from the records (`explanations.py`)."""
        return explain(self)

    @property
    def what(self) -> str:
        return self.sentences.what

    @property
    def why(self) -> str:
        return self.sentences.why

    @property
    def fix(self) -> str:
        return self.sentences.fix

    @property
    def fix_alternatives(self) -> tuple[str, ...]:
        """The fixes of the occurrences folded in with another fix (`also`), in words."""
        return tuple(f.fix for f in self.also)

    @property
    def unconfirmed_reason(self) -> str:
        """Why backward never reached the tensor (`unreached`), in words; "" when it did."""
        return unreached_sentence(self.unreached) if self.unreached is not None else ""

    @property
    def sites(self) -> tuple[tuple[SiteRole, Site], ...]:
        """Each site with its role: the write, the save, the later read (or views), the module's constructor."""
        out: list[tuple[SiteRole, Site]] = [(SiteRole.WRITE, self.mutation)]
        if self.saved is not None:
            out.append((SiteRole.SAVE, self.saved))
        if self.read is not None:
            out.append((self.read_role, self.read))
        origin = self.mutation.origin
        if origin is not None:
            out.append((SiteRole.CONSTRUCTOR, Site(op=self.mutation.op, file=origin.file, line=origin.line)))
        return tuple(out)

    @property
    def details(self) -> dict[str, Any]:
        """The typed fields as one JSON object (the report's `details`): cause, slot, target, facts, ranks."""
        return self._details(self.sentences)

    def _details(self, words: Sentences) -> dict[str, Any]:
        out: dict[str, Any] = {"why": words.why}  # the sentence the JSON has always carried here
        if self.cause is not None:
            out["cause"] = str(self.cause)
        if self.slot is not None:
            out["slot"] = self.slot
        if self.target is not None:
            out["target"] = self.target
        if self.facts is not None:  # what the rule measured; not what only a sentence reads
            out.update((f.name, getattr(self.facts, f.name)) for f in fields(self.facts) if not f.metadata.get("words_only"))
        if self.ranks:
            out["ranks"] = list(self.ranks)
        if self.also:
            out["fixes"] = [words.fix, *self.fix_alternatives]
        return out

    @property
    def message(self) -> str:
        """What happened, why it matters, the fix, and (for a prediction backward never reached) why
        it is unconfirmed: the text of the JSON's `message` and of an InplaceError."""
        return self._message(self.sentences)

    def _message(self, words: Sentences) -> str:
        what, why, fix = words
        text = f"{what} {why}" if what else why
        text += f"\nFix: {fix}."
        if self.unconfirmed_reason:
            text += f"\nUnconfirmed: {self.unconfirmed_reason}"
        return text

    @property
    def dedupe_key(self) -> tuple[Any, ...]:
        """Same cause: the same rule, writing line and saving (or reading) line.

        One line that writes several layers' parameters (`opt.step()`), or runs
        in several modules (`for m in self.layers: h = m(h) + h`), or in several
        steps, is one finding; its `places` list the parameters or modules. The
        saving side counts by the line in the caller's code (`d_out = D(fake)`),
        so the layers of one model's forward fold together.
        """
        saved = None
        if self.saved is not None:
            by = caller_frame(self.saved)
            saved = (by.file, by.line) if by is not None else (self.saved.file, self.saved.line)
        read = (self.read.file, self.read.line) if self.read is not None else None
        return (self.code, self.mutation.file, self.mutation.line, self.mutation.op, saved, read)

    def with_(self, **changes: Any) -> Finding:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        words = self.sentences  # made once for the three places the JSON says them
        return {
            "code": self.code,
            "severity": str(self.severity),
            "title": self.title,
            "message": self._message(words),
            "fix": words.fix,
            "confirmed": self.confirmed,
            "count": self.count,
            "places": list(self.places),
            "why": words.why,
            "unconfirmed_reason": self.unconfirmed_reason,
            "unreached": str(self.unreached) if self.unreached is not None else None,
            "mutation": self.mutation.to_dict(),
            "saved": self.saved.to_dict() if self.saved else None,
            "read": self.read.to_dict() if self.read else None,
            "fixes": [x.to_dict() for x in self.fixes],
            "cause": str(self.cause) if self.cause is not None else None,
            "caught": self.caught,
            "details": self._details(words),
            # the rest of the record, so `from_dict` rebuilds it whole in another process
            "facts": facts_to_dict(self.facts) if self.facts is not None else None,
            "slot": self.slot,
            "target": self.target,
            "read_role": str(self.read_role),
            "ranks": list(self.ranks),
            "also": [a.to_dict() for a in self.also],
            "root_label": self.root_label,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """The finding `to_dict` wrote, as the record it was: its words are made again from it (the
        sentences in the dict are for people and are not read back)."""
        return cls(
            code=data["code"], severity=Severity(data["severity"]), title=data["title"],
            mutation=Site.from_dict(data["mutation"]),
            saved=Site.from_dict(data["saved"]) if data.get("saved") else None,
            confirmed=data.get("confirmed"),
            read=Site.from_dict(data["read"]) if data.get("read") else None,
            count=int(data.get("count", 1)), places=tuple(data.get("places", ())),
            unreached=Unreached(data["unreached"]) if data.get("unreached") else None,
            fixes=tuple(Fix.from_dict(x) for x in data.get("fixes", ())),
            cause=cause_of(data["cause"]) if data.get("cause") else None,
            facts=facts_from_dict(data["facts"]) if data.get("facts") else None,
            slot=data.get("slot"), target=data.get("target"), read_role=SiteRole(data.get("read_role", "read")),
            ranks=tuple(data.get("ranks", ())), also=tuple(cls.from_dict(a) for a in data.get("also", ())),
            caught=bool(data.get("caught")), root_label=data.get("root_label", ROOT_LABEL),
        )

