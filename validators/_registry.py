"""The validator model: ``Validator`` protocol, ``@validator`` registry, specs.

A validator is registered as a *factory*: a function taking keyword-only
params (all with defaults) and returning a pure check
``DecisionInput -> Sequence[Issue]``. The registry binds params to get a
:class:`BoundValidator`, whose :meth:`~BoundValidator.spec` (name, version,
effective params) rebuilds exactly the same validator at replay. A change of
behaviour is a new version, registered beside the old one, never an edit.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from ._errors import ParamError, RegistryError
from ._model import Decision, DecisionInput, Verdict

__all__ = [
    "Issue",
    "Check",
    "Validator",
    "ValidatorSpec",
    "ValidatorFactory",
    "BoundValidator",
    "validator",
    "registered",
    "load_plugins",
    "is_known",
    "get_factory",
    "build_validator",
]


@dataclass(frozen=True, slots=True)
class Issue:
    """One thing a check found wrong. A check returns none (accept) or many;
    the bound validator folds them into one Decision."""

    verdict: Verdict
    code: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


Check = Callable[[DecisionInput], Sequence[Issue]]


@runtime_checkable
class Validator(Protocol):
    """What a suite member is: named, versioned, parametrised, pure."""

    name: str
    version: str
    params: Mapping[str, Any]

    def __call__(self, inp: DecisionInput) -> Decision: ...


@dataclass(frozen=True, slots=True)
class ValidatorSpec:
    """The recorded identity of a validator; :func:`build_validator` of it
    gives the same behaviour back."""

    name: str
    version: str
    params: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "params": dict(self.params)}


class BoundValidator:
    """A factory with its params bound: a callable ``DecisionInput -> Decision``."""

    __slots__ = ("name", "version", "params", "trusted", "_check", "_ok")

    def __init__(self, name: str, version: str, params: Mapping[str, Any], check: Check,
                 trusted: bool = False) -> None:
        self.name = name
        self.version = version
        self.params = dict(params)
        #: A built-in, whose decisions are recordable by construction (a
        #: user's are checked: see ``Suite.evaluate``).
        self.trusted = trusted
        self._check = check
        self._ok = Decision(verdict=Verdict.ACCEPT, code="ok", validator=name, validator_version=version)

    def spec(self) -> ValidatorSpec:
        return ValidatorSpec(self.name, self.version, dict(self.params))

    def __call__(self, inp: DecisionInput) -> Decision:
        issues = self._check(inp)
        if not issues:
            return self._ok
        if not self.trusted:
            issues = [_with_verdict(i) for i in issues]
        # The worst issue names the decision; the engine acts on its code.
        # Ties keep the check's order, which puts the actionable one first.
        worst = issues[0]
        for issue in issues[1:]:
            if issue.verdict.severity > worst.verdict.severity:
                worst = issue
        evidence = dict(worst.evidence)
        if len(issues) > 1:
            evidence["other_issues"] = [
                {"verdict": i.verdict.value, "code": i.code, "message": i.message, "evidence": i.evidence}
                for i in issues
                if i is not worst
            ]
        # model_construct: the fields are built here from typed parts, so
        # re-validating them on the hot path would only cost time.
        return Decision.model_construct(
            verdict=worst.verdict,
            code=worst.code,
            message=worst.message,
            evidence=evidence,
            validator=self.name,
            validator_version=self.version,
        )

    def __repr__(self) -> str:
        return f"BoundValidator({self.name}@{self.version}, {self.params})"


_VERDICTS = {v.value: v for v in Verdict}


def _with_verdict(issue: Any) -> Any:
    """A user's issue whose verdict is written as its plain string
    (``"reject"``) gets the :class:`Verdict` it names; anything else is left
    for :func:`~._suite.recordable` to refuse."""
    verdict = getattr(issue, "verdict", None)
    if (isinstance(issue, Issue) and isinstance(verdict, str) and not isinstance(verdict, Verdict)
            and verdict in _VERDICTS):
        return replace(issue, verdict=_VERDICTS[verdict])
    return issue


class ValidatorFactory:
    """A registered factory. Call it with params to get a BoundValidator."""

    def __init__(self, name: str, version: str, fn: Callable[..., Check]) -> None:
        self.name = name
        self.version = version
        self.fn = fn
        self.doc = inspect.getdoc(fn) or ""
        self.defaults: dict[str, Any] = {}
        for p in inspect.signature(fn).parameters.values():
            if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty:
                raise RegistryError(name, f"parameter {p.name!r} must be keyword-only with a default")
            self.defaults[p.name] = p.default
        #: One of the project's own validators: its params are checked by the
        #: factory itself, and its decisions are recordable by construction.
        self.builtin = fn.__module__.startswith("loopledger.")
        self._types: dict[str, Any] | None = None  # built on first use: see _check_types

    def _check_types(self, params: dict[str, Any]) -> None:
        """Each given param against its factory's annotation (``max_amount:
        float = 100.0``), strictly: ``"ten"``, ``"10"`` or ``true`` for a
        float is a :class:`ParamError` when the suite is built, not an error
        in every decision. A param without an annotation, or with one that
        does not resolve, is the factory's own to check; so are the
        built-ins' params, whose checks say more (``an integer >= 2``)."""
        if self._types is None:
            self._types = {} if self.builtin else _param_types(self.fn, self.defaults)
        from pydantic import ValidationError

        for name, value in params.items():
            adapter = self._types.get(name)
            if adapter is None:
                continue
            try:
                adapter[1].validate_python(value, strict=True)
            except ValidationError:
                raise ParamError(name, f"a value of type {adapter[0]}", value) from None

    def __call__(self, **params: Any) -> BoundValidator:
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "none"
            raise ParamError(unknown[0], f"one of the known params ({known})", params[unknown[0]])
        self._check_types(params)
        effective = {**self.defaults, **params}
        check = self.fn(**effective)
        if not callable(check):
            raise RegistryError(self.name, f"its factory returned {reprlib.repr(check)}; expected a check function "
                                           "(DecisionInput -> list of Issues)")
        return BoundValidator(self.name, self.version, effective, check, trusted=self.builtin)


def _param_types(fn: Callable[..., Any], names: Iterable[str]) -> dict[str, tuple[str, Any]]:
    """Each annotated param's type, as written and as a pydantic adapter."""
    import typing

    from pydantic import TypeAdapter

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - an annotation naming what its module cannot resolve: unchecked
        return {}
    types = {}
    for name in names:
        hint = hints.get(name)
        if hint is None or hint is Any:
            continue
        try:
            written = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            types[name] = (written, TypeAdapter(hint))
        except Exception:  # noqa: BLE001 - a type pydantic cannot check: the factory's own to check
            continue
    return types


_REGISTRY: dict[str, dict[str, ValidatorFactory]] = {}


def validator(*, name: str, version: str) -> Callable[[Callable[..., Check]], ValidatorFactory]:
    """Register a check factory under ``name`` and ``version``."""

    for what, value in (("name", name), ("version", version)):
        # Recorded in every decision row, and written ``name@version`` in a suite.
        if not isinstance(value, str) or not value or value != value.strip() or "@" in value:
            raise RegistryError(str(name), f"@validator {what}={value!r}: expected a non-empty string without "
                                           "surrounding spaces or '@'")

    def register(fn: Callable[..., Check]) -> ValidatorFactory:
        versions = _REGISTRY.setdefault(name, {})
        if version in versions and versions[version].fn is not fn:
            raise RegistryError(name, f"version {version!r} is already registered")
        factory = ValidatorFactory(name, version, fn)
        versions[version] = factory
        return factory

    return register


#: A distribution of validators names, in this entry-point group, the
#: modules whose ``@validator`` definitions register them; they are imported
#: the first time a name is not known (see :func:`load_plugins`).
ENTRY_POINT_GROUP = "loopledger.validators"
_plugins: dict[str, Any] = {"loaded": False, "failed": None}


def load_plugins() -> None:
    """Import, once, every module named in the ``loopledger.validators``
    entry-point group of the installed distributions, e.g. in a plugin's
    ``pyproject.toml``: ``[project.entry-points."loopledger.validators"]
    acme = "acme_validators"``. A module that fails to import is a
    :class:`RegistryError` naming the entry point, raised now and at every
    later call (the other entry points are still imported), so a name that
    only a broken plugin could have given is never reported as merely
    unknown."""
    if not _plugins["loaded"]:
        _plugins["loaded"] = True
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                point.load()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a plugin that fails to import: one line
                if _plugins["failed"] is None:
                    _plugins["failed"] = RegistryError(
                        point.name, f"entry point {point.value!r} of group {ENTRY_POINT_GROUP} failed to "
                                    f"import: {type(exc).__name__}: {exc}")
    if _plugins["failed"] is not None:
        raise _plugins["failed"]


def unknown_validator(name: str) -> str:
    """Why ``name`` is no registered validator, in one line: the closest
    known name, the known names, and an installed plugin that failed to
    import (it may be the one that would have given it)."""
    import difflib

    try:
        load_plugins()
        failed = None
    except RegistryError as exc:
        failed = exc
    known = sorted(_REGISTRY)
    close = difflib.get_close_matches(name, known, n=1)
    reason = f"unknown validator {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    reason += f"; known: {', '.join(known)}"
    if failed is not None:
        reason += f"; an installed plugin that might have given it cannot be used: {failed.reason}"
    return reason


def is_known(name: str) -> bool:
    """Whether ``name`` is registered, without importing installed plugins
    (they are imported the first time a name is not known)."""
    return name in _REGISTRY


def registered() -> dict[str, tuple[str, ...]]:
    """Every registered name and its versions, oldest first (installed
    plugins' included)."""
    load_plugins()
    return {name: tuple(versions) for name, versions in sorted(_REGISTRY.items())}


def get_factory(name: str, version: str | None = None) -> ValidatorFactory:
    """The factory for ``name`` at ``version`` (default: the latest registered)."""
    versions = _REGISTRY.get(name)
    if not versions:
        try:
            load_plugins()  # once: an installed plugin may register it
        except RegistryError:
            if name not in _REGISTRY:  # a working plugin may have given it all the same
                raise
        versions = _REGISTRY.get(name)
    if not versions:
        raise RegistryError(name, unknown_validator(name))
    if version is None:
        return list(versions.values())[-1]
    if version not in versions:
        try:
            load_plugins()  # once: an installed plugin may register this version
        except RegistryError:
            pass  # a broken plugin: the version stays unknown, as said below
        if version not in versions:
            raise RegistryError(name, f"unknown version {version!r}; known: {', '.join(versions)}")
    return versions[version]


def build_validator(spec: ValidatorSpec | Mapping[str, Any]) -> BoundValidator:
    """Rebuild a validator from its recorded spec."""
    if not isinstance(spec, ValidatorSpec):
        spec = ValidatorSpec(spec["name"], spec.get("version"), spec.get("params") or {})
    return get_factory(spec.name, spec.version)(**dict(spec.params))
