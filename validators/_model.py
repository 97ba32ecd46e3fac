"""The data a decision reads and the decision it returns.

A validator is a pure function ``DecisionInput -> Decision``. Everything it
may look at is a field of :class:`DecisionInput`, so the engine (live) and
the replay (from the traces) hand it exactly the same thing, and
``DecisionInput.to_json()`` / ``from_json()`` round-trip it.

Field names follow the CONTRACT: candidate items are the ``items_json``
items, a Decision is one row of the ``validations`` table.
"""

from __future__ import annotations

import enum
from functools import cached_property
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loopledger.canonical import canonical_json, loads

from ._errors import InputError
from ._steps import StepRecord

__all__ = [
    "Verdict",
    "Decision",
    "TextItem",
    "ToolCallItem",
    "ClaimItem",
    "PlanItem",
    "Item",
    "FinishReason",
    "Candidate",
    "ToolSpec",
    "Contract",
    "Policy",
    "Context",
    "Resource",
    "ProposedCall",
    "Evidence",
    "Operation",
    "Pending",
    "RunFacts",
    "DecisionInput",
    "split_tool_name",
    "PENDING_OUTCOMES",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Verdict(str, enum.Enum):
    """What the engine does with the candidate; ordered by severity."""

    ACCEPT = "accept"  # no objection
    REPAIR = "repair"  # the model can fix it: feed the message back, same step
    ASK = "ask"  # only a person can resolve it: WAITING_USER
    REJECT = "reject"  # must not be acted on; the code says what happens next

    def __str__(self) -> str:
        return self.value

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Verdict.ACCEPT: 0, Verdict.REPAIR: 1, Verdict.ASK: 2, Verdict.REJECT: 3}


class Decision(_Frozen):
    """One validator's judgement of one candidate (a ``validations`` row)."""

    verdict: Verdict
    #: Stable machine code (``ok`` for accept); listed per validator in docs/validators.md.
    code: str
    #: One line for a person, and for the model when the verdict is ``repair``.
    message: str = ""
    #: Plain JSON explaining the verdict (paths, offsets, ids); never a secret.
    evidence: dict[str, Any] = Field(default_factory=dict)
    #: The validator that decided, and its version; empty until a suite records it.
    validator: str = ""
    validator_version: str = ""

    def to_json(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Decision:
        return _parse(cls, text, "Decision")


# --- candidate -------------------------------------------------------------


class TextItem(_Frozen):
    type: Literal["text"] = "text"
    text: str


class ToolCallItem(_Frozen):
    """A proposed tool call. ``arguments`` when they parsed as a JSON object,
    else ``raw_arguments`` holds the text exactly as received."""

    type: Literal["tool_call"] = "tool_call"
    call_id: str
    #: As the model wrote it; may carry a version suffix (``deploy.service@v1``).
    name: str
    version: str | None = None
    arguments: dict[str, Any] | None = None
    raw_arguments: str | None = None


class ClaimItem(_Frozen):
    """A statement the answer makes, with the evidence entries it rests on
    (``kind`` or ``kind:subject``, as in a contract's required_evidence)."""

    type: Literal["claim"] = "claim"
    text: str
    evidence: tuple[str, ...] = ()


class PlanItem(_Frozen):
    type: Literal["plan"] = "plan"
    steps: tuple[Any, ...] = ()


Item = Annotated[Union[TextItem, ToolCallItem, ClaimItem, PlanItem], Field(discriminator="type")]

FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "error", "incomplete"]


class Candidate(_Frozen):
    """What one model attempt produced (a ``candidates`` row)."""

    items: tuple[Item, ...] = ()
    finish_reason: FinishReason
    candidate_id: str | None = None

    @cached_property
    def tool_calls(self) -> tuple[ToolCallItem, ...]:
        return tuple(i for i in self.items if isinstance(i, ToolCallItem))

    @cached_property
    def claims(self) -> tuple[ClaimItem, ...]:
        return tuple(i for i in self.items if isinstance(i, ClaimItem))

    @property
    def is_terminal(self) -> bool:
        """A final-answer candidate: no tool call in it."""
        return not self.tool_calls


def split_tool_name(name: str, version: str | None) -> tuple[str, str | None]:
    """``deploy.service@v1`` -> (``deploy.service``, ``v1``). A version in the
    name wins: it is what the model asked for, and hiding it behind an
    explicit field could turn a stale call into a current one."""
    base, sep, suffix = name.rpartition("@")
    if sep and base and suffix:
        return base, suffix
    return name, version


# --- context ---------------------------------------------------------------


class ToolSpec(_Frozen):
    """One entry of the tool registry snapshot frozen in the context."""

    name: str
    version: str | None = None
    #: JSON Schema (draft 2020-12) of the arguments object.
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    read_only: bool = False
    requires_approval: bool = False
    enabled: bool = True
    #: Which arguments name resources: argument -> kind (``workspace_path``,
    #: or an object kind such as ``order``). Paths are canonicalised.
    resources: dict[str, str] = Field(default_factory=dict)

    @cached_property
    def schema_hash(self) -> str:
        from loopledger.canonical import content_id

        return content_id(self.schema_)


class Contract(_Frozen):
    """The task contract (CONTRACT: scenario ``contract``)."""

    goal: str = ""
    required_evidence: tuple[str, ...] = ()
    #: None: any registered tool; a list (maybe empty): only these (``*`` globs allowed).
    allowed_tools: tuple[str, ...] | None = None
    forbidden_paths: tuple[str, ...] = ()
    wait_ttl_s: float | None = None
    version: int | str = 1


class Policy(BaseModel):
    """Run policy. Known keys are typed; other keys are kept as given."""

    model_config = ConfigDict(frozen=True, extra="allow")

    #: Tools that need a person's approval before they run.
    approval_required: tuple[str, ...] = ()


class Context(_Frozen):
    """The frozen context artifact a decision may read."""

    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    policy: Policy = Field(default_factory=Policy)
    contract: Contract = Field(default_factory=Contract)
    tenant: str | None = None
    #: Remaining budget by name (``steps``, ``tool_calls``, ``tokens``, ``cost_usd``, ``deadline_s``).
    budget: dict[str, float | int | None] = Field(default_factory=dict)

    @cached_property
    def tool_index(self) -> dict[str, tuple[ToolSpec, ...]]:
        return _tool_index(self.tools)


#: Tool indexes by the identity of the (frozen) ToolSpec objects they index:
#: the contexts of every run recorded with one registry snapshot share its
#: parsed specs, so they share the index too. Each entry holds the specs it
#: was built from, so an id is never reused while its entry exists.
_INDEXES: dict[tuple[int, ...], tuple[tuple[ToolSpec, ...], dict[str, tuple[ToolSpec, ...]]]] = {}


def _tool_index(tools: tuple[ToolSpec, ...]) -> dict[str, tuple[ToolSpec, ...]]:
    key = tuple(map(id, tools))
    hit = _INDEXES.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], tools)):
        return hit[1]
    index: dict[str, list[ToolSpec]] = {}
    for spec in tools:
        index.setdefault(spec.name, []).append(spec)
    built = {name: tuple(specs) for name, specs in index.items()}
    if len(_INDEXES) >= 256:
        _INDEXES.clear()
    _INDEXES[key] = (tuple(tools), built)
    return built


# --- canonical proposal ----------------------------------------------------


class Resource(_Frozen):
    """A resource a call touches, after canonicalisation."""

    kind: str  # workspace_path, or an object kind (order, service, ...)
    argument: str  # the argument it came from
    raw: Any = None  # the value as the model wrote it
    value: str | None = None  # canonical value; None when it has none
    tenant: str | None = None  # owning tenant, when the runtime knows it
    error: str | None = None  # why there is no canonical value


class ProposedCall(_Frozen):
    """A tool call resolved and canonicalised (what would be authorised)."""

    call_id: str
    tool: str
    version: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    resources: tuple[Resource, ...] = ()
    #: content_id of the canonical arguments; with ``tool`` the loop detectors' call identity.
    args_hash: str = ""

    @property
    def call_key(self) -> str:
        return f"{self.tool}:{self.args_hash}"


# --- run facts -------------------------------------------------------------


class Evidence(_Frozen):
    kind: str
    subject: str | None = None
    operation_id: str | None = None
    step: int | None = None

    def satisfies(self, requirement: str) -> bool:
        """``kind`` is met by any subject, ``kind:subject`` only by that one."""
        kind, sep, subject = requirement.partition(":")
        if kind != self.kind:
            return False
        return not sep or subject == (self.subject or "")


#: Operation outcomes that mean a side effect is not settled yet.
PENDING_OUTCOMES = frozenset({"pending", "dispatched", "running", "unknown_outcome", "background_accepted"})


class Operation(_Frozen):
    operation_id: str
    tool: str
    tool_version: str | None = None
    step: int | None = None
    args_hash: str = ""
    #: CONTRACT terminal result, or ``pending``/``dispatched``/``running`` before it.
    outcome: str
    error_code: str | None = None
    work_id: str | None = None
    #: For ``background_accepted``: the background work has completed.
    work_done: bool = False


class Pending(_Frozen):
    kind: Literal["operation", "approval", "background", "user"]
    id: str
    tool: str | None = None


class RunFacts(_Frozen):
    """What the runtime knows happened in the run before this candidate."""

    evidence: tuple[Evidence, ...] = ()
    operations: tuple[Operation, ...] = ()
    pending: tuple[Pending, ...] = ()
    #: Error codes seen so far, in order.
    error_codes: tuple[str, ...] = ()
    #: One record per finished step, in order (the loop detectors' input).
    history: tuple[StepRecord, ...] = ()

    def has_evidence(self, requirement: str) -> bool:
        return any(e.satisfies(requirement) for e in self.evidence)


class DecisionInput(_Frozen):
    """Exactly what a decision may read."""

    run_id: str = ""
    step: int = 0
    attempt: int = 0
    candidate: Candidate
    context: Context = Field(default_factory=Context)
    #: The canonical proposal; empty means "derive it" (see :meth:`proposed_calls`).
    proposal: tuple[ProposedCall, ...] = ()
    facts: RunFacts = Field(default_factory=RunFacts)

    @cached_property
    def proposed_calls(self) -> tuple[ProposedCall, ...]:
        """The recorded proposal, or one derived from the candidate when none
        was recorded (imported traces). Calls whose arguments did not parse
        have no proposal."""
        if self.proposal or not self.candidate.tool_calls:
            return self.proposal
        from ._proposal import canonical_proposal

        return canonical_proposal(self.candidate, self.context)

    def to_json(self) -> str:
        return canonical_json(self.model_dump(mode="json", by_alias=True))

    @classmethod
    def from_json(cls, text: str | bytes) -> DecisionInput:
        return _parse(cls, text, "DecisionInput")


def _parse(cls: type[_Frozen], text: str | bytes, what: str) -> Any:
    try:
        return cls.model_validate(loads(text))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "$"
        raise InputError(f"{what}.{where}", first["msg"]) from exc
    except ValueError as exc:  # not JSON at all
        raise InputError(what, f"not JSON ({exc})") from exc
