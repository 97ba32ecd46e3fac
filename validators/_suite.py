"""Suites: a named set of validators with params, versioned by content.

``suite_version`` is derived from the members' names, versions and
effective params (defaults filled in), so the same suite written with keys
in another order, or members in another order, has the same version, and
any change of params or of a member's version gives a new one. The suite's
``name`` is a label and does not enter the version: two files that judge
alike are the same suite.

Loaders: ``load_suite("default")`` (a bundled suite), ``load_suite(PATH)``
(a YAML file in the CONTRACT format) and ``load_suite("pkg.mod:attr")`` (a
:class:`Suite`, a callable returning one, or a suite mapping). Every problem
is one :class:`SuiteError` naming the file and the field.
"""

from __future__ import annotations

import importlib
import os
import reprlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from loopledger._yaml import LimitExceeded, load as load_yaml, not_utf8
from loopledger.canonical import CanonicalJSONError, canonical_json, content_id, is_unicode

from ._detectors import DETECTORS
from ._errors import InputError, ParamError, RegistryError, SuiteError
from ._model import Decision, DecisionInput, Verdict
from ._registry import BoundValidator, ValidatorSpec, get_factory, is_known, load_plugins, unknown_validator

__all__ = ["Suite", "SuiteResult", "load_suite", "parse_suite", "bundled_suites"]


@dataclass(frozen=True, slots=True)
class SuiteResult:
    """The decisions of one suite on one candidate."""

    suite_version: str
    #: One decision per member, in member order.
    decisions: tuple[Decision, ...]

    @property
    def verdict(self) -> Verdict:
        """The most severe verdict (accept when every member accepts)."""
        worst = Verdict.ACCEPT
        for d in self.decisions:
            if d.verdict.severity > worst.severity:
                worst = d.verdict
        return worst

    @property
    def blocking(self) -> tuple[Decision, ...]:
        """Non-accept decisions, most severe first (member order within a verdict)."""
        return tuple(
            sorted((d for d in self.decisions if d.verdict is not Verdict.ACCEPT), key=lambda d: -d.verdict.severity)
        )


class Suite:
    """An ordered set of bound validators with a content-derived version."""

    __slots__ = ("name", "members", "version")

    def __init__(self, name: str, members: Iterable[BoundValidator]) -> None:
        self.name = name
        self.members: tuple[BoundValidator, ...] = tuple(members)
        seen: set[str] = set()
        for m in self.members:
            if m.name in seen:
                raise SuiteError(f"suite {name!r}", f"validator {m.name!r} appears twice")
            seen.add(m.name)
        self.version = suite_version(m.spec() for m in self.members)

    @property
    def suite_version(self) -> str:
        return self.version

    def specs(self) -> list[ValidatorSpec]:
        return [m.spec() for m in self.members]

    def to_dict(self) -> dict[str, Any]:
        """The suite as a mapping :func:`parse_suite` reads back (pinned versions)."""
        return {"name": self.name, "validators": [m.spec().to_dict() for m in self.members]}

    def loop_detectors(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, params) of the members that are loop detectors, for the
        batch form (``detect_batch``) over a step table."""
        out = []
        for m in self.members:
            if m.name in DETECTORS:
                params = dict(m.params)
                out.append((m.name, params))
        return out

    def evaluate(self, inp: DecisionInput) -> SuiteResult:
        """Run every member on the input. A member that raises is a bug in
        that member; it is recorded as its own ``reject``/``validator_error``
        decision so one broken check cannot hide the others' verdicts; so
        is a user's member whose decision cannot be recorded (:func:`recordable`).
        ``inp`` not a :class:`DecisionInput` is :class:`InputError`."""
        if not isinstance(inp, DecisionInput):
            raise InputError("inp", "expected a DecisionInput (DecisionInput.from_json() reads one), "
                                    f"got {type(inp).__name__}")
        decisions = []
        for m in self.members:
            try:
                decisions.append(m(inp) if m.trusted else recordable(m(inp)))
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - recorded, see docstring (sys.exit too)
                decisions.append(
                    Decision(
                        verdict=Verdict.REJECT,
                        code="validator_error",
                        message=f"{m.name} raised {type(exc).__name__}: {exc}",
                        evidence={"exception": type(exc).__name__},
                        validator=m.name,
                        validator_version=m.version,
                    )
                )
        return SuiteResult(self.version, tuple(decisions))

    def __repr__(self) -> str:
        return f"Suite({self.name!r}, version={self.version}, members={[m.name for m in self.members]})"


def recordable(decision: Decision) -> Decision:
    """``decision``, if the journal and the trace tables can hold it: a
    verdict that is one of the four, a code and a message of Unicode text,
    evidence that is plain JSON (not a set, a date, NaN, a lone surrogate).
    Otherwise a bug in its validator, recorded as that validator's
    ``reject``/``validator_error`` decision naming the problem."""
    if not isinstance(decision.verdict, Verdict):
        field, problem = "verdict", (f"{reprlib.repr(decision.verdict)} is not a Verdict (or one of the strings "
                                     f"{', '.join(v.value for v in Verdict)})")
    elif not _is_text(decision.code):
        field, problem = "code", f"{reprlib.repr(decision.code)} is not Unicode text"
    elif not _is_text(decision.message):
        field, problem = "message", f"{reprlib.repr(decision.message)} is not Unicode text"
    else:
        try:
            canonical_json(decision.evidence)
            return decision
        except CanonicalJSONError as exc:
            field, problem = "evidence", f"is not plain JSON ({exc})"
    message = f"{decision.validator} gave a decision that cannot be recorded: its {field} {problem}"
    # repr keeps a bad value's lone surrogates out; a key in an evidence path may still hold one.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return Decision(verdict=Verdict.REJECT, code="validator_error", message=message,
                    evidence={"unrecordable": field}, validator=decision.validator,
                    validator_version=decision.validator_version)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and is_unicode(value)


def suite_version(specs: Iterable[ValidatorSpec]) -> str:
    """``s-`` and 16 hex digits of the content id of the sorted member specs."""
    body = sorted((s.to_dict() for s in specs), key=lambda d: (d["name"], d["version"]))
    return "s-" + content_id(body)[:16]


# --- loading ---------------------------------------------------------------


def bundled_suites() -> list[str]:
    folder = resources.files("loopledger.datasets").joinpath("suites")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_suite(ref: str | os.PathLike[str] | Suite) -> Suite:
    """A suite by bundled name, YAML path, or ``module:attr``. A reference
    that names no suite (or is not one) is a :class:`SuiteError` whose
    ``where`` is ``suite``; a suite that cannot be read or built names its
    file (or object) and field."""
    if isinstance(ref, Suite):
        return ref
    text = os.fspath(ref) if isinstance(ref, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise SuiteError("suite", "expected a bundled suite name, a .yaml path, module:attr or a Suite, "
                                  f"got {reprlib.repr(ref)}")
    if isinstance(ref, os.PathLike) or text.lower().endswith((".yaml", ".yml")) or "/" in text:
        return _load_file(Path(text), text)
    if ":" in text:
        return _load_object(text)
    if text in bundled_suites():
        entry = resources.files("loopledger.datasets").joinpath("suites", f"{text}.yaml")
        return _parse_text(entry.read_text(encoding="utf-8"), f"{text}.yaml")
    if os.path.lexists(text):  # a file in the working folder, named without .yaml
        return _load_file(Path(text), text)
    raise SuiteError(
        "suite",
        f"unknown suite {text!r}; expected a bundled suite ({', '.join(bundled_suites())}), "
        "a .yaml file or module:attr",
    )


def _load_file(path: Path, where: str) -> Suite:
    try:
        # A named pipe would block the read for ever, a device give no YAML.
        if path.exists() and not path.is_file() and not path.is_dir():
            raise SuiteError(where, "not a regular file (a pipe, socket or device); expected a suite .yaml file")
        text = path.read_text(encoding="utf-8")
        beside = path.resolve().parent
    except OSError as exc:
        hint = ""
        if isinstance(exc, FileNotFoundError) and path.suffix in (".yaml", ".yml") and path.stem in bundled_suites():
            hint = f"; the bundled suite of that name is --suite {path.stem}"
        raise SuiteError(where, f"cannot read the file ({exc.strerror or exc}){hint}") from exc
    except UnicodeDecodeError as exc:
        raise SuiteError(where, not_utf8(exc.object, exc)) from None
    return _parse_text(text, where, beside)


def _parse_text(text: str, where: str, beside: Path | None = None) -> Suite:
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        if isinstance(exc, LimitExceeded):  # valid YAML, but more than a suite file may hold
            raise SuiteError(where, f"{line}{exc.problem}") from None
        raise SuiteError(where, f"{line}not valid YAML ({getattr(exc, 'problem', None) or exc})") from exc
    return parse_suite(data, where, beside=beside)


def _import(module_name: str, where: str, beside: Path | None = None) -> Any:
    """A user's module, imported; one that cannot be, or raises while it
    runs, is a :class:`SuiteError` naming ``where``. ``beside``: the folder
    of the suite file that lists the module, where it is looked for when
    the import path does not have it (as Python finds a script's modules
    beside the script); that folder then stays on the import path, at its
    end, for what the module imports later."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        top = module_name.split(".")[0]
        if (isinstance(exc, ModuleNotFoundError) and exc.name == top and beside is not None
                and str(beside) not in sys.path
                and ((beside / f"{top}.py").is_file() or (beside / top / "__init__.py").is_file())):
            sys.path.append(str(beside))
            importlib.invalidate_caches()
            return _import(module_name, where)
        raise SuiteError(where, f"cannot import module {module_name!r} ({exc})") from exc
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed while it ran: one line
        raise SuiteError(where, f"module {module_name!r} failed while importing: "
                                f"{type(exc).__name__}: {exc}") from exc


def _load_object(ref: str) -> Suite:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise SuiteError(ref, "expected package.module:attr, with both parts named")
    # Looked for in the working directory too when the import path does not
    # have it, as ``python -m`` and pytest find a project's own modules:
    # ``--suite mysuites:strict`` run from the folder of mysuites.py.
    obj: Any = _import(module_name, ref, Path.cwd())
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SuiteError(ref, f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, Suite):
        try:
            obj = obj()
        except SuiteError:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's callable failed: one line
            raise SuiteError(ref, f"calling {attr} (expected to return a Suite or a suite mapping, with no "
                                  f"arguments) raised {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, Suite):
        return obj
    if isinstance(obj, Mapping):
        return parse_suite(obj, ref)
    raise SuiteError(ref, f"expected a Suite, a callable returning one, or a suite mapping; got {type(obj).__name__}")


def parse_suite(data: Any, where: str = "suite", *, beside: str | os.PathLike[str] | None = None) -> Suite:
    """Build a suite from its mapping form (CONTRACT 'Suite files').
    ``beside``: the folder of the file it was read from, where the modules
    of its ``imports`` are also looked for."""
    if not isinstance(data, Mapping):
        raise SuiteError(where, f"expected a mapping with 'name' and 'validators', got {type(data).__name__}")
    unknown = sorted(set(data) - {"name", "validators", "description", "imports"})
    if unknown:
        raise SuiteError(f"{where}: {unknown[0]}", "unknown field; expected name, validators, description, imports")
    _import_modules(data.get("imports", []), where, None if beside is None else Path(beside))
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SuiteError(f"{where}: name", f"expected a non-empty string, got {reprlib.repr(name)}")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise SuiteError(f"{where}: description", f"expected a string, got {type(description).__name__}")
    entries = data.get("validators")
    if not isinstance(entries, Sequence) or isinstance(entries, str) or not entries:
        raise SuiteError(f"{where}: validators", "expected a non-empty list of validator names or {name: params}")
    members = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        field = f"{where}: validators[{i}]"
        member = _member(entry, field)
        if member.name in seen:
            raise SuiteError(field, f"validator {member.name!r} already listed at validators[{seen[member.name]}]")
        seen[member.name] = i
        members.append(member)
    return Suite(name, members)


def _import_modules(modules: Any, where: str, beside: Path | None) -> None:
    """``imports``: modules whose ``@validator`` definitions register the
    suite's own validators, imported before its members are looked up."""
    if not isinstance(modules, Sequence) or isinstance(modules, str):
        raise SuiteError(f"{where}: imports", "expected a list of module names")
    for i, name in enumerate(modules):
        field = f"{where}: imports[{i}]"
        if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
            raise SuiteError(field, f"expected a module name like acme.validators, got {name!r}")
        _import(name, field, beside)


def _member(entry: Any, field: str) -> BoundValidator:
    version: Any = None
    if isinstance(entry, str):
        vname, params = entry, {}
    elif isinstance(entry, Mapping) and "name" in entry:
        # The pinned form a recorded suite writes: {name, version, params}.
        extra = sorted(set(entry) - {"name", "version", "params"})
        if extra:
            raise SuiteError(f"{field}.{extra[0]}", "unknown field; expected name, version, params")
        vname, version, params = entry["name"], entry.get("version"), entry.get("params") or {}
    elif isinstance(entry, Mapping) and entry and set(entry) <= {"version", "params"}:
        raise SuiteError(f"{field}.name", "missing; the pinned form is {name, version, params}")
    elif isinstance(entry, Mapping) and len(entry) == 1:
        ((vname, params),) = entry.items()
        params = {} if params is None else params
    else:
        raise SuiteError(field, "expected a validator name or a one-key mapping {name: {params}}")
    if not isinstance(vname, str):
        raise SuiteError(field, f"expected a validator name, got {vname!r}")
    if "@" in vname and version is None:
        vname, version = vname.split("@", 1)
    if version is not None:
        version = str(version)
    if not isinstance(params, Mapping):
        raise SuiteError(f"{field}.{vname}", f"expected a mapping of params, got {type(params).__name__}")
    if not is_known(vname):
        try:
            load_plugins()  # installed plugins may register it
        except RegistryError:
            pass  # one fails to import: named below if the name is still unknown
        if not is_known(vname):
            raise SuiteError(field, unknown_validator(vname))
    try:
        factory = get_factory(vname, version)
    except RegistryError as exc:
        raise SuiteError(f"{field}.version", exc.reason) from None
    for param, value in params.items():
        # Params are recorded (canonical JSON) and enter the suite version:
        # plain JSON only, with string keys.
        if not isinstance(param, str):
            raise SuiteError(f"{field}.{vname}", f"expected param names as strings, got {param!r}")
        try:
            canonical_json(value)
        except CanonicalJSONError as exc:
            raise SuiteError(f"{field}.{vname}.{param}", f"expected plain JSON (strings, numbers, true/false, "
                                                         f"null, lists, string-keyed maps): {exc}") from None
    try:
        return factory(**dict(params))
    except ParamError as exc:
        raise SuiteError(f"{field}.{vname}.{exc.param}", f"expected {exc.expected}, got {exc.value!r}") from None
    except RegistryError as exc:  # the factory broke its contract (see ValidatorFactory.__call__)
        raise SuiteError(f"{field}.{vname}", exc.reason) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's factory failed: one line
        raise SuiteError(f"{field}.{vname}", f"the validator's factory raised {type(exc).__name__}: {exc}") from None
