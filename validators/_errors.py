"""Typed errors of the validators package, with one root.

    ValidatorsError
    ├── SuiteError            a suite cannot be built: ``where`` names the file
    │                         (or object) and field, ``reason`` what was expected
    ├── RegistryError         a validator name/version clash or an unknown name
    ├── ParamError            a validator/detector parameter is wrong
    ├── InputError            a DecisionInput (or a step table) is malformed
    └── PathRejected          a workspace path cannot be made canonical
                              (absolute, escapes the root, ambiguous separator)

A validator that *disagrees* with a candidate never raises: it returns a
``Decision``. These errors are for broken configuration and broken inputs, so
that callers can tell "the candidate is bad" (data) from "the setup is bad".
Constructors take structured arguments and keep them as attributes; ``code``
is a stable string that may be persisted.
"""

from __future__ import annotations

from loopledger._errors import PicklableError


class ValidatorsError(PicklableError):
    """Root of every error ``loopledger.validators`` raises on purpose."""

    code = "validators_error"


class SuiteError(ValidatorsError):
    """A suite file, object or member is wrong.

    The message reads ``<where>: <reason>``, e.g.
    ``strict.yaml: validators[3]: unknown validator 'tool_exist'; known: ...``.
    """

    code = "bad_suite"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class RegistryError(ValidatorsError):
    code = "registry_error"

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"validator {name!r}: {reason}")
        self.name = name
        self.reason = reason


class InputError(ValidatorsError):
    """A DecisionInput or step table does not have the documented shape."""

    code = "bad_decision_input"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class PathRejected(ValidatorsError, ValueError):
    """A workspace path has no canonical form inside the workspace root."""

    code = "path_rejected"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"path {path!r}: {reason}")
        self.path = path
        self.reason = reason


class ParamError(ValidatorsError, ValueError):
    """A validator or detector parameter has the wrong type or value."""

    code = "bad_param"

    def __init__(self, param: str, expected: str, value: object) -> None:
        super().__init__(f"params.{param}: expected {expected}, got {value!r}")
        self.param = param
        self.expected = expected
        self.value = value
