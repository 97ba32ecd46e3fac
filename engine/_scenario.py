"""Scenario files (CONTRACT.md, 'Scenario files'): a task for the engine with
a scripted model, scripted user replies, injected faults and expectations.

:func:`load_scenario` reads one YAML file and returns a :class:`Scenario`,
or raises :class:`BadInput` naming the file, the field and what was
expected. Nothing is recorded until every file of a ``run`` has loaded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from loopledger._args import UnreadableEntry, files_under, not_a_file
from loopledger._yaml import LimitExceeded, load as load_yaml, not_utf8
from loopledger.canonical import is_unicode
from loopledger.validators import PathRejected, canonical_glob, canonical_workspace_path

from ._backends import FAULT_KINDS, fault_candidates
from ._errors import BadInput
from ._states import State


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected an integer, not true or false")
    return value


#: A whole number (``true`` is not one; ``3.0`` is, as older run specs hold
#: it), small enough for every journal and for JSON readers that hold
#: numbers as doubles.
Int = Annotated[int, BeforeValidator(_not_a_bool), Field(le=2**53)]
#: Seconds a scenario may ask for: ten years.
MAX_SECONDS = 10 * 365 * 86_400
#: Every reason a run can end (or wait) with; ``expect.reason`` names one.
REASONS = frozenset({
    "completed", "loop_detected", "no_progress", "validation_failed", "tool_failed", "model_error",
    "protocol_error", "max_steps", "max_tool_calls", "max_tokens", "max_cost", "max_attempts", "deadline",
    "policy", "cancelled", "expired", "waiting_for_user", "waiting_for_approval", "waiting_for_tool",
})
#: Evidence kinds whose subject is a workspace path.
_PATH_KINDS = frozenset({"file_read", "file_written", "listing"})
#: A scenario id is part of run ids, file names and workspace folders.
SCENARIO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}\Z")


def _stored(info: ValidationInfo) -> bool:
    """Whether the scenario being validated is a run's frozen spec, written
    when the run was created, perhaps by an earlier version with looser
    rules: the rules added since apply to files being loaded, not to runs
    already recorded (they must resume as they were)."""
    return bool(info.context and info.context.get("stored"))


class _Strict(BaseModel):
    # Numbers are finite: .inf and .nan are refused with the field's name.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


#: What a null given for a call's arguments is refused with.
_NULL_ARGUMENTS = {
    "arguments": "expected a mapping of argument names to values, got null (leave arguments out for a call "
                 "without arguments)",
    "raw_arguments": "expected a string (the arguments as the model sent them), got null",
}


def _not_finite(value: Any, path: str) -> str | None:
    """The path of the first float in ``value`` that is not finite, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        items: Any = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _not_finite(item, where)
        if found is not None:
            return found
    return None


def _finite_json(value: Any) -> Any:
    """``value`` when every number in it is finite. JSON has no .inf or
    .nan: sent, one would become null, and the trace would not hold what the
    script says."""
    where = _not_finite(value, "")
    if where is not None:
        raise ValueError(f"{where.lstrip('.') or 'the value'} is not a finite number; expected finite numbers only "
                         "(JSON has no .inf or .nan)")
    return value


class ScriptedCall(_Strict):
    """One tool call a scripted model entry makes."""

    name: str
    arguments: dict[str, Any] | None = None
    raw_arguments: str | None = None  # sent as-is: may not parse
    id: str | None = None

    @field_validator("arguments", "raw_arguments", mode="before")
    @classmethod
    def _not_null(cls, value: Any, info: ValidationInfo) -> Any:
        # Left out, a call has no arguments ({}); a null is not a way of
        # saying so, it is a value of the wrong type. A run's frozen spec
        # writes the form not given as null.
        if value is None and not _stored(info):
            raise ValueError(_NULL_ARGUMENTS[info.field_name])
        return value

    _finite = field_validator("arguments")(classmethod(lambda cls, value: _finite_json(value)))

    @model_validator(mode="after")
    def _one_form(self) -> ScriptedCall:
        if self.arguments is not None and self.raw_arguments is not None:
            raise ValueError("give arguments or raw_arguments, not both")
        return self


class ScriptedClaim(_Strict):
    text: str
    evidence: list[str] = Field(default_factory=list)


class Usage(_Strict):
    """What one attempt used, as a provider would report it."""

    tokens_in: Int | None = Field(default=None, ge=0, le=10**12)
    tokens_out: Int | None = Field(default=None, ge=0, le=10**12)
    cost_usd: float | None = Field(default=None, ge=0, le=1e9)


class ModelEntry(_Strict):
    """What the scripted model answers to one attempt."""

    tool_calls: list[ScriptedCall] = Field(default_factory=list)
    text: str | None = None
    final: str | None = None
    claims: list[ScriptedClaim] = Field(default_factory=list)
    plan: list[Any] | None = None

    _finite = field_validator("plan")(classmethod(lambda cls, value: _finite_json(value)))
    # Faulty forms:
    stream: Literal["truncated"] | None = None
    finish_reason: Literal["stop", "tool_calls", "length", "content_filter", "error"] | None = None
    raw_arguments: str | None = None  # shorthand: the raw arguments of the entry's only tool call
    error: str | None = None  # the provider answers with an error event
    repeat: Int = Field(default=1, ge=1, le=10_000)
    usage: Usage | None = None

    @field_validator("raw_arguments", mode="before")
    @classmethod
    def _raw_not_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and not _stored(info):
            raise ValueError(_NULL_ARGUMENTS["raw_arguments"])
        return value

    @field_validator("usage", mode="before")
    @classmethod
    def _stored_usage(cls, value: Any, info: ValidationInfo) -> Any:
        # Specs written before usage had its own model: any keys, numbers as floats.
        if _stored(info) and isinstance(value, dict):
            value = {key: (round(v) if key != "cost_usd" and isinstance(v, float) else v)
                     for key, v in value.items() if key in Usage.model_fields}
        return value

    @model_validator(mode="after")
    def _shape(self, info: ValidationInfo) -> ModelEntry:
        if self.stream == "truncated" and (self.finish_reason or self.error) and not _stored(info):
            # A broken stream has no finish and no error event: one of the two would not be played.
            other = f"finish_reason: {self.finish_reason}" if self.finish_reason else "error"
            raise ValueError(f"stream: truncated (the stream breaks, nothing ends it) cannot be played with {other}; "
                             "expected one faulty form per entry")
        if self.error and not _stored(info):
            # An error event is all the attempt is: anything beside it would not be played.
            beside = [name for name in ("tool_calls", "text", "final", "claims", "plan", "finish_reason",
                                        "raw_arguments") if getattr(self, name) not in (None, [])]
            if beside:
                raise ValueError(f"error (the provider answers with an error event, nothing else of the attempt "
                                 f"is played) cannot be played with {', '.join(beside)}; expected one faulty form "
                                 "per entry (error alone, with usage if the attempt used some)")
        if not (self.tool_calls or self.final is not None or self.text is not None or self.error or self.plan
                or self.stream or self.finish_reason or self.raw_arguments is not None):
            raise ValueError("an entry needs tool_calls, final, text, plan, error, or a faulty form "
                             "(stream: truncated, finish_reason, raw_arguments)")
        if self.raw_arguments is not None and len(self.tool_calls) > 1:
            raise ValueError("raw_arguments at entry level is the arguments of the entry's one tool call; "
                             f"expected one tool call, got {len(self.tool_calls)}")
        return self


class Contract(_Strict):
    goal: str
    required_evidence: list[str] = Field(default_factory=list)
    allowed_tools: list[str] | None = None
    forbidden_paths: list[str] = Field(default_factory=list)
    wait_ttl_s: float = Field(default=86_400, gt=0, le=MAX_SECONDS)
    version: Int = 1

    @field_validator("required_evidence")
    @classmethod
    def _known_kinds(cls, entries: list[str], info: ValidationInfo) -> list[str]:
        # A kind no tool gives could never be met: the run would end as if
        # the model had failed, for a typo in the scenario.
        from ._tools import EVIDENCE_KIND

        if _stored(info):
            return entries
        kinds = sorted(set(EVIDENCE_KIND.values()))
        canonical: list[str] = []
        for index, entry in enumerate(entries):
            kind, _, subject = entry.partition(":")
            if kind not in kinds or (":" in entry and not subject):
                raise ValueError(f"item {index}, {entry!r}, is no evidence a tool gives; expected KIND or "
                                 f"KIND:SUBJECT, KIND one of {', '.join(kinds)}")
            if subject and kind in _PATH_KINDS:
                # The workspace names a path in canonical form (./notes/a.txt
                # is notes/a.txt): the requirement is written the same way,
                # or it could never be met.
                try:
                    entry = f"{kind}:{canonical_workspace_path(subject)}"
                except PathRejected as exc:
                    raise ValueError(f"item {index}, {entry!r}: {exc.reason}; expected a workspace path "
                                     "relative to its root (e.g. notes/a.txt)") from None
            canonical.append(entry)
        return canonical

    @field_validator("forbidden_paths")
    @classmethod
    def _canonical_globs(cls, patterns: list[str], info: ValidationInfo) -> list[str]:
        # Written the way a person means them (``/payments/``, ``payments``)
        # and recorded in canonical form, so the permission validator and a
        # replay of the run match them as recorded. A run's frozen spec
        # keeps the patterns it ran with.
        if _stored(info):
            return patterns
        canonical: list[str] = []
        for index, pattern in enumerate(patterns):
            try:
                canonical.append(canonical_glob(pattern))
            except PathRejected as exc:
                raise ValueError(f"item {index}, {pattern!r}: {exc.reason}; expected a glob of workspace paths "
                                 "(e.g. payments/** or payments/)") from None
        return canonical


class Budgets(_Strict):
    max_steps: Int | None = Field(default=None, ge=1)
    max_tool_calls: Int | None = Field(default=None, ge=0)
    max_tokens: Int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    max_attempts: Int | None = Field(default=None, ge=1)
    deadline_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)


class FaultSpec(_Strict):
    tool: str
    call: Int = Field(default=1, ge=1)
    kind: Literal[FAULT_KINDS]  # type: ignore[valid-type]
    #: ``object_ambiguous``: the objects the call's subject could mean.
    candidates: list[str] | None = Field(default=None, validate_default=True)

    @field_validator("candidates")
    @classmethod
    def _candidates_of_an_ambiguity(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        fault_candidates(info.data.get("kind", ""), value)
        return value


class UserReply(_Strict):
    """One scripted reply: ``approve`` (an approval's decision) or ``answer``
    (a question's), exactly one of them."""

    approve: bool | None = None
    answer: Any = None
    by: str | None = Field(default=None, min_length=1, max_length=200)  # who replies, as `reply --by`
    note: str | None = Field(default=None, min_length=1, max_length=2000)  # why, as `reply --reason`

    _finite = field_validator("answer")(classmethod(lambda cls, value: _finite_json(value)))

    @model_validator(mode="after")
    def _one_of_approve_or_answer(self, info: ValidationInfo) -> UserReply:
        # A run's frozen spec writes both keys, the one not given as null.
        # ``answer: null`` is an answer (as ``reply --answer null`` is);
        # ``approve: null`` is no decision.
        given = [name for name in ("approve", "answer")
                 if getattr(self, name) is not None or (name == "answer" and name in self.model_fields_set)]
        if len(given) != 1 and not _stored(info):
            raise ValueError("expected exactly one of approve (true or false) or answer, got "
                             + (" and ".join(given) if given else "neither"))
        return self


class ExpectedDecision(_Strict):
    step: Int = Field(ge=1)
    attempt: Int = Field(default=1, ge=1)
    validator: str = ""
    verdict: Literal["accept", "repair", "ask", "reject"]


class Expect(_Strict):
    status: str | None = None
    reason: str | None = None
    side_effects: dict[str, Annotated[Int, Field(ge=0)]] = Field(default_factory=dict)
    decisions: list[ExpectedDecision] = Field(default_factory=list)

    @field_validator("decisions")
    @classmethod
    def _one_verdict_each(cls, decisions: list[ExpectedDecision], info: ValidationInfo) -> list[ExpectedDecision]:
        # Two verdicts for one decision: a file whose --check could never pass.
        seen: dict[tuple[int, int, str], str] = {}
        for d in decisions:
            key = (d.step, d.attempt, d.validator)
            if seen.setdefault(key, d.verdict) != d.verdict and not _stored(info):
                who = d.validator or "the candidate as a whole"
                raise ValueError(f"step {d.step} attempt {d.attempt} ({who}) is expected both {seen[key]} and "
                                 f"{d.verdict}; expected one verdict per decision")
        return decisions

    @field_validator("reason")
    @classmethod
    def _a_reason(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and value not in REASONS and not _stored(info):
            raise ValueError(f"expected a run's reason ({', '.join(sorted(REASONS))})")
        return value

    @field_validator("status")
    @classmethod
    def _a_run_state(cls, value: str | None) -> str | None:
        names = [s.value for s in State]
        if value is not None and value not in names:
            raise ValueError(f"expected a run state ({', '.join(names)})")
        return value


class Scenario(_Strict):
    id: str = Field(min_length=1)
    description: str = ""
    tenant: str = "acme"
    contract: Contract
    budgets: Budgets = Field(default_factory=Budgets)
    faults: list[FaultSpec] = Field(default_factory=list)
    model: list[ModelEntry] | dict[str, list[ModelEntry]] = Field(default_factory=list)
    user: list[UserReply] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)
    suite: str = "default"
    source: str = ""  # the file it came from (filled by the loader)

    @field_validator("id")
    @classmethod
    def _id_chars(cls, value: str, info: ValidationInfo) -> str:
        if _stored(info):  # the run's id was made from it already
            return value
        if not SCENARIO_ID.match(value):
            raise ValueError("expected a name of ASCII letters and digits and '_', '.', ':', '@', '+', '-' (at most "
                             "128, starting with a letter or digit)")
        return value

    @field_validator("model")
    @classmethod
    def _prompt_versions(cls, value: Any, info: ValidationInfo) -> Any:
        # A key no --prompt-version could name (``v 2``, ``v2.md``) would
        # never be played: a typo, not a script.
        from ._prompts import VERSION_NAME

        if isinstance(value, dict) and not _stored(info):
            for key in value:
                if key != "default" and not VERSION_NAME.match(key):
                    raise ValueError(f"key {key!r} is no prompt version; expected default or a prompt version's "
                                     "name (ASCII letters and digits, '_' and '-', at most 64: the NAME of "
                                     "prompts/NAME.md)")
        return value

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, value: str) -> str:
        from ._workspace import TENANT_NAME

        if not TENANT_NAME.match(value):
            raise ValueError("expected a name of ASCII letters and digits, '_', '.' or '-' (at most 64, not "
                             "starting with '.', '_' or '-')")
        return value

    @field_validator("faults")
    @classmethod
    def _one_fault_per_call(cls, faults: list[FaultSpec]) -> list[FaultSpec]:
        seen: dict[tuple[str, int], int] = {}
        for index, fault in enumerate(faults):
            earlier = seen.setdefault((fault.tool, fault.call), index)
            if earlier != index:
                raise ValueError(f"faults[{index}] is a second fault on {fault.tool} call {fault.call} "
                                 f"(faults[{earlier}]); expected one fault per call")
        return faults

    @model_validator(mode="before")
    @classmethod
    def _name_bare_raw_arguments(cls, data: Any) -> Any:
        """An entry of ``raw_arguments`` alone (CONTRACT.md's faulty form) is
        a call, to the contract's first allowed tool (a glob's first demo
        tool), whose arguments do not parse; without ``allowed_tools``, to
        the tool the script calls next.
        Anything not shaped as expected is left to the fields' own checks."""
        if not isinstance(data, dict):
            return data
        contract = data.get("contract")
        allowed = contract.get("allowed_tools") if isinstance(contract, dict) else None
        model = data.get("model")
        lists = list(model.items()) if isinstance(model, dict) else [(None, model)]
        named: dict[Any, Any] = {}
        for key, entries in lists:
            if not isinstance(entries, list):
                continue
            out = list(entries)
            for index, entry in enumerate(entries):
                if not (isinstance(entry, dict) and isinstance(entry.get("raw_arguments"), str)
                        and not entry.get("tool_calls")):
                    continue
                # Worked out only here: most scenarios (and every recorded
                # run's spec, read back through this) have no such entry.
                name = (_first_tool(allowed) if isinstance(allowed, list) else None) or _called_next(
                    entries[index + 1:])
                if name is None:
                    where = f"model.{key}[{index}]" if key is not None else f"model[{index}]"
                    raise ValueError(f"{where}: raw_arguments alone names no tool (no contract.allowed_tools, and "
                                     "no later entry calls one); expected tool_calls: [{name: TOOL}] beside it")
                out[index] = {**entry, "tool_calls": [{"name": name}]}
            named[key] = out
        if not named:
            return data
        return {**data, "model": named[None] if None in named else {**model, **named}}

    def entries_for(self, prompt_version: str) -> list[ModelEntry]:
        """The scripted model's entries for a prompt version: its own list, else
        ``default``; ``repeat: N`` expanded."""
        if isinstance(self.model, dict):
            chosen = self.model.get(prompt_version, self.model.get("default", []))
        else:
            chosen = self.model
        expanded: list[ModelEntry] = []
        for entry in chosen:
            expanded.extend([entry] * entry.repeat)
        return expanded

    def spec(self) -> dict[str, Any]:
        """The scenario as plain JSON, frozen into the run's spec."""
        return self.model_dump(mode="json", exclude={"source"})


def _called_next(entries: list[Any]) -> str | None:
    """The tool the first of ``entries`` that calls one calls (raw entries)."""
    for e in entries:
        calls = e.get("tool_calls") if isinstance(e, dict) else None
        if isinstance(calls, list) and calls and isinstance(calls[0], dict) and isinstance(calls[0].get("name"), str):
            return calls[0]["name"]
    return None


def _first_tool(allowed: list[Any]) -> str | None:
    """The first tool ``allowed_tools`` names: its first plain name, else the
    first demo tool its first glob (``orders.*``) matches."""
    import fnmatch

    from ._tools import tool_registry_snapshot

    patterns = [a for a in allowed if isinstance(a, str) and a]
    for pattern in patterns:
        if not any(c in pattern for c in "*?["):
            return pattern
    names = [spec["name"] for spec in tool_registry_snapshot()]
    for pattern in patterns:
        for name in names:
            if fnmatch.fnmatchcase(name, pattern):
                return name
    return None


def _bundled_hint(path: Path) -> str:
    """For a missing ``datasets/scenarios/...`` (the docs' examples, run
    outside a checkout of the project): where the installed copy is."""
    parts = path.parts
    for i in range(len(parts) - 1):
        if parts[i:i + 2] == ("datasets", "scenarios"):
            return f" (the bundled scenarios are installed in {bundled_folder().joinpath(*parts[i + 2:])})"
    return ""


def bundled_folder() -> Path:
    """The folder of the bundled scenarios, wherever the package is installed."""
    from importlib import resources

    return Path(str(resources.files("loopledger.datasets").joinpath("scenarios")))


def _where(path: str, loc: Iterable[Any]) -> str:
    field, last = "", ""
    for part in loc:
        if part == "[key]":  # pydantic's mark of a mapping key that is wrong, after the key
            field = field[:-len(last)] + f" (key {last.strip('[].')})"
            continue
        last = f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
        field += last
    return f"{path}: {field}" if field else path


def _message(error: Mapping[str, Any]) -> str:
    """pydantic's message in the words of a scenario file: ``expected ...``."""
    text = re.sub(r" or instance of \w+", "", error["msg"].removeprefix("Value error, "))
    for said, meant in (("Input should be a valid dictionary", "expected a mapping"),
                        ("Input should be a valid list", "expected a list"),
                        ("Input should be a valid string", "expected a string"),
                        ("Input should be a valid integer", "expected an integer"),
                        ("Input should be a valid number", "expected a number"),
                        ("Input should be a valid boolean", "expected true or false"),
                        ("Input should be a finite number", "expected a finite number"),
                        ("Input should be", "expected"),
                        ("String should have at least 1 character", "expected non-empty text"),
                        ("String should have", "expected text with"),
                        ("Field required", "required field missing"),
                        ("Extra inputs are not permitted", "unknown field")):
        if text.startswith(said):
            return meant + text[len(said):]
    return text


def _check_text(value: Any, source: str, loc: tuple[Any, ...] = ()) -> None:
    """Refuse text no journal can keep: a NUL character (PostgreSQL's text
    cannot hold one) or an unpaired surrogate (YAML's ``\\uD800`` escape;
    not Unicode text, so it has no UTF-8 form)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise BadInput(_where(source, loc), "contains a NUL character; expected text without one")
        if not is_unicode(value):
            raise BadInput(_where(source, loc), "contains an unpaired surrogate; expected valid Unicode text")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, source, loc)
            _check_text(item, source, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_text(item, source, (*loc, index))


def parse_scenario(data: Any, source: str, *, stored: bool = False) -> Scenario:
    """Validate a scenario; ``stored``: ``data`` is a recorded run's frozen
    spec (see :func:`_stored`)."""
    if data is None:
        raise BadInput(source, "the file holds no scenario; expected a mapping with id, contract, model, ...")
    if not isinstance(data, dict):
        raise BadInput(source, f"expected a mapping at the top level, got {type(data).__name__}")
    # Unknown top-level keys first: a cheap check that names a stray key
    # before anything walks the values under it.
    for key in data:
        if key not in Scenario.model_fields:
            known = ", ".join(name for name in Scenario.model_fields if name != "source")
            raise BadInput(_where(source, [key]), f"unknown field; expected one of {known}")
    _check_text(data, source)
    try:
        # A file's values have the types the format names ("1" is not a
        # number, "no" not a boolean); a recorded spec is read as it was
        # written, by the looser rules of its time (3.0 as a whole number).
        scenario = Scenario.model_validate(data, strict=not stored, context={"stored": stored})
    except ValidationError as exc:
        # A union (model: a list, or a map of lists) fails once per branch:
        # the error that went deepest names the field the user got wrong.
        def where(error: Mapping[str, Any]) -> list[Any]:
            return [p for p in error["loc"] if not (isinstance(p, str) and p.startswith(("list[", "dict[")))]

        first = max(exc.errors(), key=lambda error: len(where(error)))
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f", got {got!r}"
        raise BadInput(_where(source, where(first)), f"{_message(first)}{shown}") from None
    return scenario.model_copy(update={"source": source})


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise BadInput(str(path), f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(str(path), not_utf8(exc.object, exc)) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else "YAML"
        if isinstance(exc, LimitExceeded):  # valid YAML, but more than a scenario may hold
            raise BadInput(f"{path}: {line}", str(exc.problem)) from None
        raise BadInput(f"{path}: {line}", f"not valid YAML ({getattr(exc, 'problem', exc)})") from None
    scenario = parse_scenario(data, str(path))
    suite = scenario.suite
    named_as_file = suite.lower().endswith((".yaml", ".yml")) or "/" in suite
    if named_as_file and ":" not in suite and not Path(suite).is_absolute():
        # A suite file is named relative to the scenario that names it, as a
        # user reads it, wherever the command runs from (one found only from
        # the working directory, as earlier versions read it, still counts).
        beside = (path.parent / suite).resolve()
        if beside.is_file() or not Path(suite).is_file():
            scenario = scenario.model_copy(update={"suite": str(beside)})
    return scenario


def scenario_files(paths: Iterable[str | Path]) -> list[Path]:
    """Every ``*.yaml`` under each folder (hidden ones left out), and each
    file given, in a stable order; a file named twice, or reached through
    two of the paths (a folder and a folder inside it, a link), is listed
    once, where it came first."""
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            try:  # hidden ones left out: .git, .venv, an editor's lock
                files = files_under(path, ("*.yaml",), "a scenario file")
            except UnreadableEntry as exc:
                raise BadInput(str(exc.path), exc.why) from None
        elif path.is_file():
            files = [path]
        else:
            raise BadInput(str(path), not_a_file(path, "a scenario file (.yaml) or a folder of them")
                           + _bundled_hint(path))
        for file in files:
            real = file.resolve()
            if real not in seen:
                seen.add(real)
                found.append(file)
    return found


def load_scenarios(paths: Iterable[str | Path]) -> list[Scenario]:
    """Load every scenario, failing on the first bad one; ids must be unique."""
    scenarios = [load_scenario(p) for p in scenario_files(paths)]
    seen: dict[str, str] = {}
    for s in scenarios:
        if s.id in seen:
            raise BadInput(f"{s.source}: id", f"{s.id!r} is also the id of {seen[s.id]}")
        seen[s.id] = s.source
    return scenarios
