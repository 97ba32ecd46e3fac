"""Pure, versioned checks of model candidates; loop detectors; suites.

Everything here is a function of recorded inputs: no I/O, no clock, no
randomness, no model. The live engine and the offline replay call the same
code on the same :class:`DecisionInput` and get the same :class:`Decision`.

    suite = load_suite("default")          # or a YAML path, or "pkg.mod:attr"
    result = suite.evaluate(decision_input)
    result.verdict, result.decisions, suite.version

Loop detectors also have a streaming form (:func:`make_detector`, one per
run, fed :class:`StepRecord`) and a batch form (:func:`detect_batch` over a
polars step table of many runs) that produce the same findings.
See docs/validators.md for every validator, its codes and params.
"""

from ._detectors import DETECTORS, DIAGNOSIS_COLUMNS, Detector, Finding, detect_stream, make_detector
from ._errors import InputError, ParamError, PathRejected, RegistryError, SuiteError, ValidatorsError
from ._model import (
    Candidate,
    ClaimItem,
    Context,
    Contract,
    Decision,
    DecisionInput,
    Evidence,
    Operation,
    Pending,
    PlanItem,
    Policy,
    ProposedCall,
    Resource,
    RunFacts,
    TextItem,
    ToolCallItem,
    ToolSpec,
    Verdict,
    split_tool_name,
)
from ._paths import canonical_glob, canonical_workspace_path, glob_matches
from ._permission import tool_allowed
from ._proposal import WORKSPACE_PATH, canonical_proposal
from ._registry import (
    BoundValidator,
    Issue,
    Validator,
    ValidatorSpec,
    build_validator,
    get_factory,
    is_known,
    load_plugins,
    registered,
    unknown_validator,
    validator,
)
from ._steps import STEP_COLUMNS, StepRecord, call_key, progress_counts, steps_frame
from ._suite import Suite, SuiteResult, bundled_suites, load_suite, parse_suite

# Built-in validators register themselves on import.
from . import _structure, _tool_exists, _tool_version, _tool_args_schema  # noqa: E402,F401  isort: skip
from . import _permission, _references, _output_rules, _completion_gate, _loop_validators  # noqa: E402,F401  isort: skip
from . import _repeated_side_effect  # noqa: E402,F401  isort: skip

__all__ = [
    # model
    "Verdict",
    "Decision",
    "DecisionInput",
    "Candidate",
    "TextItem",
    "ToolCallItem",
    "ClaimItem",
    "PlanItem",
    "Context",
    "ToolSpec",
    "Contract",
    "Policy",
    "ProposedCall",
    "Resource",
    "RunFacts",
    "Evidence",
    "Operation",
    "Pending",
    "split_tool_name",
    # canonical proposal
    "canonical_workspace_path",
    "canonical_glob",
    "glob_matches",
    "canonical_proposal",
    "WORKSPACE_PATH",
    "tool_allowed",
    # registry
    "Validator",
    "validator",
    "Issue",
    "BoundValidator",
    "ValidatorSpec",
    "build_validator",
    "get_factory",
    "registered",
    "is_known",
    "load_plugins",
    "unknown_validator",
    # suites
    "Suite",
    "SuiteResult",
    "load_suite",
    "parse_suite",
    "bundled_suites",
    # loop detection
    "StepRecord",
    "STEP_COLUMNS",
    "call_key",
    "progress_counts",
    "steps_frame",
    "Finding",
    "Detector",
    "DETECTORS",
    "DIAGNOSIS_COLUMNS",
    "make_detector",
    "detect_stream",
    "detect_batch",
    # errors
    "ValidatorsError",
    "SuiteError",
    "RegistryError",
    "ParamError",
    "InputError",
    "PathRejected",
]


def __getattr__(name: str) -> object:
    # The batch form needs polars: imported on first use, not by every
    # command that loads the validators (the engine's do, replays and the
    # UI use the batch form).
    if name == "detect_batch":
        from ._detectors_batch import detect_batch

        return detect_batch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "detect_batch"})
