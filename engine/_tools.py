"""The demo tool registry (CONTRACT.md, "Scenario files": demo tools).

Two views of the same tools:

* :data:`DEMO_TOOLS`, the :class:`~loopledger.validators.ToolSpec` entries the
  validators see (names, versions, argument schemas, resources). The engine
  freezes :func:`tool_registry_snapshot` into every context artifact, so a
  replay judges a candidate against exactly the registry the run had.
* :data:`TOOL_TRAITS`, what only the runtime and the backends need: whether
  a call has a side effect, whether the provider honours an idempotency key,
  whether it runs as background work, whether a lost response can be
  reconciled. These are facts about the *provider*, kept as data so the
  engine never infers them from a tool's name.

Every schema sets ``additionalProperties: false``: an argument the tool does
not know is a mistake to repair, not something to pass through silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loopledger.validators import PathRejected, ToolSpec, canonical_workspace_path

__all__ = [
    "CONTROL_TOOLS",
    "DEMO_TOOLS",
    "EVIDENCE_KIND",
    "TOOL_TRAITS",
    "ToolTraits",
    "demo_tool",
    "evidence_subject",
    "tool_registry_snapshot",
]

_TEXT = {"type": "string", "minLength": 1, "maxLength": 4096}
_PATH = {"type": "string", "minLength": 1, "maxLength": 1024}
_ORDER_ID = {"type": "string", "pattern": "^ORD-[0-9]{4}$"}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_ADDRESS = {
    "type": "object",
    "properties": {
        "street": _TEXT,
        "city": _TEXT,
        "zip": {"type": "string", "minLength": 3, "maxLength": 16},
        "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
    },
    "required": ["street", "city", "zip"],
    "additionalProperties": False,
}

DEMO_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="workspace.read_file",
        version="v1",
        schema=_object({"path": _PATH}, ["path"]),
        read_only=True,
        resources={"path": "workspace_path"},
    ),
    ToolSpec(
        name="workspace.write_file",
        version="v1",
        schema=_object({"path": _PATH, "content": {"type": "string", "maxLength": 1_048_576}}, ["path", "content"]),
        resources={"path": "workspace_path"},
    ),
    ToolSpec(
        name="workspace.list",
        version="v1",
        schema=_object({"path": _PATH}, ["path"]),
        read_only=True,
        resources={"path": "workspace_path"},
    ),
    ToolSpec(
        name="orders.get_order",
        version="v1",
        schema=_object({"order_id": _ORDER_ID}, ["order_id"]),
        read_only=True,
        resources={"order_id": "order"},
    ),
    ToolSpec(
        name="orders.update_address",
        version="v1",
        schema=_object(
            {"order_id": _ORDER_ID, "address": _ADDRESS, "expected_version": {"type": "integer", "minimum": 1}},
            ["order_id", "address", "expected_version"],
        ),
        resources={"order_id": "order"},
    ),
    ToolSpec(
        name="payments.refund",
        version="v1",
        schema=_object(
            {"order_id": _ORDER_ID, "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000}},
            ["order_id", "amount"],
        ),
        resources={"order_id": "order"},
    ),
    ToolSpec(
        name="reports.export",
        version="v1",
        schema=_object({"query": _TEXT, "delay_s": {"type": "number", "minimum": 0, "maximum": 86_400}}, ["query"]),
    ),
    ToolSpec(
        name="tests.run",
        version="v1",
        schema=_object({"suite": {"enum": ["unit", "contract"]}}, ["suite"]),
        read_only=True,
    ),
    ToolSpec(
        name="deploy.service",
        version="v2",
        schema=_object(
            {"service": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,62}$"}, "version": {"type": "string", "minLength": 1, "maxLength": 64}},
            ["service", "version"],
        ),
        requires_approval=True,
        resources={"service": "service"},
    ),
    ToolSpec(
        name="ask_user",
        version="v1",
        # `schema` is the JSON Schema the answer must match; the engine
        # treats a missing one as "any JSON value". It must itself be a valid
        # 2020-12 schema (checked against the metaschema jsonschema ships):
        # a question nobody could answer is a proposal to repair.
        schema=_object({"question": _TEXT,
                        "schema": {"type": "object", "$ref": "https://json-schema.org/draft/2020-12/schema"}},
                       ["question"]),
    ),
)

def evidence_subject(tool: str, arguments: Mapping[str, Any]) -> str:
    """The subject of a call's evidence, from its arguments (CONTRACT: the
    order id, the test suite, the path, the service)."""
    for key in ("order_id", "path", "suite", "service"):
        if arguments.get(key) is not None:
            if key == "path":  # as the workspace backend names it: ./notes/a.txt is notes/a.txt
                try:
                    return canonical_workspace_path(arguments[key])
                except PathRejected:
                    pass
            return str(arguments[key])
    return tool


#: Evidence kind a successful call produces (CONTRACT table). The subject is
#: the path, order id, suite, work id or service the call was about.
EVIDENCE_KIND: dict[str, str] = {
    "workspace.read_file": "file_read",
    "workspace.write_file": "file_written",
    "workspace.list": "listing",
    "orders.get_order": "order_found",
    "orders.update_address": "address_updated",
    "payments.refund": "refund_confirmed",
    "reports.export": "report_ready",
    "tests.run": "tests_passed",
    "deploy.service": "deployed",
    "ask_user": "user_answer",
}

#: Tools the engine handles itself; a backend refuses them.
CONTROL_TOOLS = frozenset({"ask_user"})


@dataclass(frozen=True)
class ToolTraits:
    """What the runtime must know about a tool's provider."""

    #: A call changes state outside the run; each real execution is one
    #: row of the backend's ``executions`` table.
    side_effect: bool
    #: The provider deduplicates by idempotency key: a second send with the
    #: same key returns the first result and executes nothing. False means a
    #: second send executes again (payments.refund), so only the engine's
    #: "never send twice" guarantee prevents a double effect.
    honours_idempotency_key: bool = True
    #: The call returns ``background_accepted`` and a ``work_id``; the result
    #: arrives later through ``poll_work``.
    background: bool = False
    #: After a timed-out call the provider can tell whether it executed. The
    #: deploy API cannot: its lookup answers ``unknown_outcome`` and the
    #: engine has to ask a person.
    confirms_after_timeout: bool = True
    #: Handled by the engine, never sent to a backend.
    control: bool = False


TOOL_TRAITS: dict[str, ToolTraits] = {
    "workspace.read_file": ToolTraits(side_effect=False),
    "workspace.write_file": ToolTraits(side_effect=True),
    "workspace.list": ToolTraits(side_effect=False),
    "orders.get_order": ToolTraits(side_effect=False),
    "orders.update_address": ToolTraits(side_effect=True),
    "payments.refund": ToolTraits(side_effect=True, honours_idempotency_key=False),
    "reports.export": ToolTraits(side_effect=True, background=True),
    "tests.run": ToolTraits(side_effect=False),
    "deploy.service": ToolTraits(side_effect=True, confirms_after_timeout=False),
    "ask_user": ToolTraits(side_effect=False, control=True),
}

_BY_NAME = {spec.name: spec for spec in DEMO_TOOLS}


def demo_tool(name: str) -> ToolSpec | None:
    """The registry entry named ``name`` (without a version), or None."""
    return _BY_NAME.get(name)


def tool_registry_snapshot() -> list[dict[str, Any]]:
    """The registry as plain JSON, in registry order, for the context artifact.

    Each entry is a ``ToolSpec`` dump (``name``, ``version``, ``schema``,
    ``read_only``, ``requires_approval``, ``enabled``, ``resources``) that
    ``ToolSpec.model_validate`` turns back into the same spec.
    """
    return [spec.model_dump(mode="json", by_alias=True) for spec in DEMO_TOOLS]
