"""``tool_args_schema``: a call's arguments satisfy the tool's JSON Schema
(draft 2020-12, through the ``jsonschema`` library).

Schemas are compiled once per schema hash and kept in a bounded cache: a
registry snapshot is re-read for every candidate, but its schemas rarely
change, and compiling is most of the cost of a check. A schema that is not a
valid 2020-12 schema is the registry's fault, not the model's: ``reject``
with ``invalid_tool_schema``. Arguments that fail are ``repair``, with the
JSON path of every failure (capped) so the model can fix them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from ._jsonschema import BoundedValidator
from ._model import DecisionInput, ToolSpec, Verdict, split_tool_name
from ._params import int_param
from ._proposal import resolve_spec
from ._registry import Issue, validator

_CACHE_SIZE = 512
_compiled: OrderedDict[str, Draft202012Validator | SchemaError] = OrderedDict()


def compiled_schema(spec: ToolSpec) -> Draft202012Validator | SchemaError:
    """The compiled validator for the spec's schema (or why it cannot be)."""
    key = spec.schema_hash
    hit = _compiled.get(key)
    if hit is not None:
        _compiled.move_to_end(key)
        return hit
    try:
        Draft202012Validator.check_schema(spec.schema_)
        # Patterns bounded in time: a registry may come from an import.
        value: Draft202012Validator | SchemaError = BoundedValidator(spec.schema_)
    except SchemaError as exc:
        value = exc
    _compiled[key] = value
    if len(_compiled) > _CACHE_SIZE:
        _compiled.popitem(last=False)
    return value


def json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _describe(error: ValidationError) -> dict[str, Any]:
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        # Point at the missing property itself, not at its parent object.
        missing = [p for p in error.validator_value if p not in error.instance]
        if missing:
            path.append(missing[0])
    return {"path": json_path(path), "keyword": str(error.validator), "message": error.message}


@validator(name="tool_args_schema", version="1")
def tool_args_schema(*, max_errors: int = 5):
    """Codes: invalid_arguments (repair), invalid_tool_schema (reject).
    Params: max_errors (failures listed per call)."""
    max_errors = int_param("max_errors", max_errors, 1)

    def check(inp: DecisionInput) -> list[Issue]:
        issues: list[Issue] = []
        for call in inp.candidate.tool_calls:
            if call.arguments is None:
                continue  # structure reports unparsed arguments
            tool, version = split_tool_name(call.name, call.version)
            spec = resolve_spec(inp.context, tool, version)
            if spec is None:
                continue  # tool_exists / tool_version report it
            compiled = compiled_schema(spec)
            if isinstance(compiled, SchemaError):
                issues.append(
                    Issue(
                        Verdict.REJECT,
                        "invalid_tool_schema",
                        f"tool {tool!r} has an invalid argument schema: {compiled.message}",
                        {"call_id": call.call_id, "tool": tool, "schema_hash": spec.schema_hash},
                    )
                )
                continue
            errors = [_describe(e) for e in compiled.iter_errors(call.arguments)]
            if not errors:
                continue
            errors.sort(key=lambda e: (e["path"], e["keyword"], e["message"]))
            first = errors[0]
            issues.append(
                Issue(
                    Verdict.REPAIR,
                    "invalid_arguments",
                    f"call {call.call_id!r} ({tool}): {first['path']}: {first['message']}",
                    {
                        "call_id": call.call_id,
                        "tool": tool,
                        "path": first["path"],
                        "errors": errors[:max_errors],
                        "error_count": len(errors),
                    },
                )
            )
        return issues

    return check
