"""The demo tool registry and the demo backends (CONTRACT.md, "Scenario files").

Every tool's success path and evidence, every fault kind, idempotency keys
and the ``executions`` table, reconciliation by lookup, background work on
a pinned clock, tenant isolation, and the ``tests.run`` log reduction.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from backend_kit import call, raw, request
from loopledger.canonical import canonical_json
from loopledger.engine._backends import (
    FAULT_KINDS,
    OUTCOMES,
    DemoBackend,
    Fault,
    ToolOutcome,
    UnknownWork,
    parse_faults,
)
from loopledger.engine._errors import BadInput
from loopledger.engine._results import reduce_result
from loopledger.engine._tools import (
    CONTROL_TOOLS,
    DEMO_TOOLS,
    EVIDENCE_KIND,
    TOOL_TRAITS,
    tool_registry_snapshot,
)
from loopledger.validators import Context, ToolSpec

HERE = Path(__file__).parent
ADDRESS = {"street": "1 Harbour Road", "city": "Portsmouth", "zip": "03801", "country": "US"}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def backend(home: Path):
    opened = DemoBackend(home)
    yield opened
    opened.close()


def fault(tool: str, kind: str, call_no: int = 1) -> tuple[Fault, ...]:
    return (Fault(tool, call_no, kind),)


# --- the registry -----------------------------------------------------------------------


def test_registry_lists_exactly_the_contract_tools() -> None:
    names = [spec.name for spec in DEMO_TOOLS]
    assert names == list(EVIDENCE_KIND) == list(TOOL_TRAITS)
    assert set(names) == {
        "workspace.read_file", "workspace.write_file", "workspace.list", "orders.get_order",
        "orders.update_address", "payments.refund", "reports.export", "tests.run", "deploy.service", "ask_user",
    }
    versions = {spec.name: spec.version for spec in DEMO_TOOLS}
    assert versions.pop("deploy.service") == "v2"
    assert set(versions.values()) == {"v1"}
    assert CONTROL_TOOLS == {"ask_user"}
    assert {s.name for s in DEMO_TOOLS if s.requires_approval} == {"deploy.service"}


@pytest.mark.parametrize("spec", DEMO_TOOLS, ids=lambda s: s.name)
def test_every_schema_is_a_closed_2020_12_object(spec: ToolSpec) -> None:
    Draft202012Validator.check_schema(spec.schema_)
    assert spec.schema_["type"] == "object"
    assert spec.schema_["additionalProperties"] is False
    assert spec.schema_["required"]
    for argument in spec.resources:
        assert argument in spec.schema_["properties"]


def test_argument_names_follow_the_contract_table() -> None:
    props = {spec.name: set(spec.schema_["properties"]) for spec in DEMO_TOOLS}
    assert props["orders.update_address"] == {"order_id", "address", "expected_version"}
    assert props["payments.refund"] == {"order_id", "amount"}
    assert props["reports.export"] == {"query", "delay_s"}
    assert props["tests.run"] == {"suite"}
    assert props["deploy.service"] == {"service", "version"}
    assert props["ask_user"] == {"question", "schema"}
    assert DEMO_TOOLS[[s.name for s in DEMO_TOOLS].index("tests.run")].schema_["properties"]["suite"] == {
        "enum": ["unit", "contract"]}


def test_snapshot_is_json_and_rebuilds_the_registry() -> None:
    snapshot = tool_registry_snapshot()
    assert json.loads(canonical_json(snapshot)) == snapshot
    context = Context.model_validate({"tools": snapshot})
    assert context.tools == DEMO_TOOLS
    assert context.tool_index["deploy.service"][0].version == "v2"


def test_only_refunds_ignore_the_idempotency_key() -> None:
    assert [n for n, t in TOOL_TRAITS.items() if not t.honours_idempotency_key] == ["payments.refund"]
    side_effects = {n for n, t in TOOL_TRAITS.items() if t.side_effect}
    assert side_effects == {"workspace.write_file", "orders.update_address", "payments.refund",
                            "reports.export", "deploy.service"}
    assert all(not spec.read_only for spec in DEMO_TOOLS if spec.name in side_effects)


# --- seed data and success paths -------------------------------------------------------------


def test_seed_orders(backend: DemoBackend, home: Path) -> None:
    # Each run gets its own copy of the seed on its first call.
    call(backend, "orders.get_order", {"order_id": "ORD-1001"}, run="seed-run")
    rows = raw(home).execute("SELECT tenant, COUNT(*), MIN(order_id), MAX(order_id) FROM orders"
                             " WHERE world = 'seed-run' GROUP BY tenant ORDER BY tenant").fetchall()
    assert [tuple(r) for r in rows] == [("acme", 50, "ORD-1001", "ORD-1050"), ("globex", 10, "ORD-2001", "ORD-2010")]
    order = call(backend, "orders.get_order", {"order_id": "ORD-1042"})
    assert order.outcome == "success" and order.status == "succeeded"
    assert order.result["status"] == "paid" and order.result["amount"] == 25.0 and order.result["version"] == 1
    assert set(order.result["address"]) >= {"street", "city", "zip"}


def test_opening_twice_seeds_once(home: Path) -> None:
    for _ in range(2):
        with DemoBackend(home) as backend:
            assert call(backend, "orders.get_order", {"order_id": "ORD-1001"}, run="r").outcome == "success"
    assert raw(home).execute("SELECT COUNT(*) FROM orders WHERE world = 'r'").fetchone()[0] == 60


def test_every_run_acts_in_its_own_world(backend: DemoBackend, home: Path) -> None:
    refund = {"order_id": "ORD-1040", "amount": 25.0}
    assert call(backend, "payments.refund", refund, run="first").outcome == "success"
    # Another run finds the order as seeded, not as the first run left it.
    assert call(backend, "payments.refund", refund, run="second").outcome == "success"
    again = call(backend, "payments.refund", refund, run="first")
    assert again.error_code == "AMOUNT_EXCEEDS_REMAINING"
    write = {"path": "src/mine.txt", "content": "first"}
    assert call(backend, "workspace.write_file", write, run="first").outcome == "success"
    read = call(backend, "workspace.read_file", {"path": "src/mine.txt"}, run="second")
    assert read.error_code == "NOT_FOUND"
    pragmas = raw(home)
    assert pragmas.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_refund_and_deploy_ids_are_numbered_within_the_run(backend: DemoBackend) -> None:
    """A result must not depend on what other runs did in the same home."""
    part = {"order_id": "ORD-1040", "amount": 10.0}
    assert call(backend, "payments.refund", part, run="other").result["refund_id"] == "RF-000001"
    assert [call(backend, "payments.refund", part, run="mine").result["refund_id"] for _ in range(2)] == \
        ["RF-000001", "RF-000002"]
    deploy = {"service": "billing", "version": "1.2.0"}
    assert call(backend, "deploy.service", deploy, run="other").result["deploy_id"] == "DEP-000001"
    assert call(backend, "deploy.service", deploy, run="mine").result["deploy_id"] == "DEP-000001"


def test_workspace_is_seeded_per_tenant(backend: DemoBackend, home: Path) -> None:
    listing = call(backend, "workspace.list", {"path": "."})
    assert {e["name"] for e in listing.result["entries"]} >= {"src", "tests", "payments"}
    provider = call(backend, "workspace.list", {"path": "payments/provider"})
    assert "client.py" in {e["name"] for e in provider.result["entries"]}
    acme = call(backend, "workspace.read_file", {"path": "payments/config.json"})
    globex = call(backend, "workspace.read_file", {"path": "payments/config.json"}, tenant="globex")
    assert json.loads(acme.result["content"])["tenant"] == "acme"
    assert json.loads(globex.result["content"])["tenant"] == "globex"
    assert (home / "workspaces" / "run-1" / "acme" / "src" / "orders.py").is_file()


SUCCESS_CASES = [
    ("workspace.read_file", {"path": "./src/../src/orders.py"}, "file_read", "src/orders.py"),
    ("workspace.write_file", {"path": "src/notes.txt", "content": "hello\n"}, "file_written", "src/notes.txt"),
    ("workspace.list", {"path": "src/"}, "listing", "src"),
    ("orders.get_order", {"order_id": "ORD-1001"}, "order_found", "ORD-1001"),
    ("orders.update_address", {"order_id": "ORD-1002", "address": ADDRESS, "expected_version": 1},
     "address_updated", "ORD-1002"),
    ("payments.refund", {"order_id": "ORD-1042", "amount": 25.0}, "refund_confirmed", "ORD-1042"),
    ("tests.run", {"suite": "contract"}, "tests_passed", "contract"),
    ("deploy.service", {"service": "billing-api", "version": "2024.06.1"}, "deployed", "billing-api"),
]


@pytest.mark.parametrize(("tool", "arguments", "kind", "subject"), SUCCESS_CASES, ids=[c[0] for c in SUCCESS_CASES])
def test_success_path_and_evidence(backend: DemoBackend, tool: str, arguments: dict, kind: str, subject: str) -> None:
    outcome = call(backend, tool, arguments, run="run-ok")
    assert (outcome.outcome, outcome.status, outcome.error_code) == ("success", "succeeded", None)
    assert outcome.evidence == ({"kind": kind, "subject": subject},)
    assert json.loads(canonical_json(outcome.result)) is not None  # plain JSON
    side_effect = TOOL_TRAITS[tool].side_effect
    assert outcome.executed is side_effect
    assert backend.side_effects("run-ok") == ({tool: 1} if side_effect else {})


def test_write_then_read_back(backend: DemoBackend, home: Path) -> None:
    written = call(backend, "workspace.write_file", {"path": "docs/new/guide.md", "content": "# Guide\n"})
    assert written.result["created"] is True
    assert (home / "workspaces" / "run-1" / "acme" / "docs" / "new" / "guide.md").read_text() == "# Guide\n"
    read = call(backend, "workspace.read_file", {"path": "docs/new/guide.md"})
    assert read.result["content"] == "# Guide\n" and read.result["sha256"] == written.result["sha256"]


def test_workspace_failures(backend: DemoBackend) -> None:
    assert call(backend, "workspace.read_file", {"path": "src/missing.py"}).error_code == "NOT_FOUND"
    assert call(backend, "workspace.read_file", {"path": "src"}).error_code == "IS_A_DIRECTORY"
    assert call(backend, "workspace.list", {"path": "README.md"}).error_code == "NOT_A_DIRECTORY"
    assert call(backend, "workspace.write_file", {"path": ".", "content": "x"}).error_code == "IS_A_DIRECTORY"
    missing = call(backend, "workspace.list", {"path": "nowhere"})
    assert (missing.outcome, missing.error_code, missing.evidence) == ("validation_failed", "NOT_FOUND", ())


def test_write_with_expected_resource_version(backend: DemoBackend) -> None:
    current = call(backend, "workspace.read_file", {"path": "README.md"}).result["sha256"]
    stale = call(backend, "workspace.write_file", {"path": "README.md", "content": "a"},
                 expected_resource_version="0" * 64)
    assert (stale.outcome, stale.error_code, stale.result["current_version"]) == ("validation_failed", "STATE_CONFLICT", current)
    fresh = call(backend, "workspace.write_file", {"path": "README.md", "content": "a"},
                 expected_resource_version=current)
    assert fresh.outcome == "success"
    created = call(backend, "workspace.write_file", {"path": "new.txt", "content": "b"},
                   expected_resource_version="absent")
    assert created.outcome == "success"


# --- orders and payments ----------------------------------------------------------------------


def test_update_address_conflict_returns_current_version(backend: DemoBackend) -> None:
    first = call(backend, "orders.update_address", {"order_id": "ORD-1003", "address": ADDRESS, "expected_version": 1})
    assert first.result["version"] == 2
    stale = call(backend, "orders.update_address", {"order_id": "ORD-1003", "address": ADDRESS, "expected_version": 1})
    assert (stale.outcome, stale.error_code, stale.evidence) == ("validation_failed", "STATE_CONFLICT", ())
    assert stale.result["current_version"] == 2
    assert not stale.executed
    after = call(backend, "orders.get_order", {"order_id": "ORD-1003"}).result
    assert after["version"] == 2 and after["address"] == ADDRESS
    again = call(backend, "orders.update_address", {"order_id": "ORD-1003", "address": ADDRESS, "expected_version": 2})
    assert again.outcome == "success" and again.result["version"] == 3


def test_expected_resource_version_on_orders(backend: DemoBackend) -> None:
    stale = call(backend, "payments.refund", {"order_id": "ORD-1004", "amount": 5}, expected_resource_version="7")
    assert stale.error_code == "STATE_CONFLICT" and stale.result["current_version"] == "1"
    assert call(backend, "payments.refund", {"order_id": "ORD-1004", "amount": 5},
                expected_resource_version="1").outcome == "success"


def test_refund_balance(backend: DemoBackend) -> None:
    part = call(backend, "payments.refund", {"order_id": "ORD-1005", "amount": 10.5})
    assert part.result["remaining"] == 14.5 and part.result["order_status"] == "partially_refunded"
    too_much = call(backend, "payments.refund", {"order_id": "ORD-1005", "amount": 14.51})
    assert (too_much.error_code, too_much.result["remaining"]) == ("AMOUNT_EXCEEDS_REMAINING", 14.5)
    assert call(backend, "payments.refund", {"order_id": "ORD-1005", "amount": 0.001}).error_code == "INVALID_ARGUMENT"
    rest = call(backend, "payments.refund", {"order_id": "ORD-1005", "amount": 14.5})
    assert rest.result["order_status"] == "refunded" and rest.result["remaining"] == 0
    order = call(backend, "orders.get_order", {"order_id": "ORD-1005"}).result
    assert order["status"] == "refunded" and order["refunded"] == 25.0 and order["version"] == 3


def test_unknown_order_is_not_found(backend: DemoBackend) -> None:
    for tool, args in (("orders.get_order", {"order_id": "ORD-9999"}),
                       ("payments.refund", {"order_id": "ORD-9999", "amount": 1})):
        outcome = call(backend, tool, args)
        assert (outcome.outcome, outcome.error_code, outcome.evidence) == ("validation_failed", "NOT_FOUND", ())


# --- tenant isolation ---------------------------------------------------------------------------


def _leaks_globex(outcome: ToolOutcome) -> bool:
    text = canonical_json(outcome.to_dict()).lower()
    return "globex" in text or "ord-20" in text


def test_other_tenants_orders_are_denied_without_data(backend: DemoBackend) -> None:
    for tool, args in (
        ("orders.get_order", {"order_id": "ORD-2001"}),
        ("payments.refund", {"order_id": "ORD-2002", "amount": 1}),
        ("orders.update_address", {"order_id": "ORD-2003", "address": ADDRESS, "expected_version": 1}),
    ):
        outcome = call(backend, tool, args, run="run-x")
        assert (outcome.outcome, outcome.error_code, outcome.evidence) == ("permission_denied", "PERMISSION_DENIED", ())
        assert not {"status", "amount", "address", "version", "current_version"} & set(outcome.result)
    assert backend.side_effects("run-x") == {}
    assert call(backend, "orders.get_order", {"order_id": "ORD-2001"}, tenant="globex").outcome == "success"


def test_state_conflict_fault_hides_other_tenants_version(backend: DemoBackend) -> None:
    outcome = call(backend, "payments.refund", {"order_id": "ORD-2004", "amount": 1},
                   faults=fault("payments.refund", "state_conflict"))
    assert outcome.error_code == "STATE_CONFLICT" and "current_version" not in outcome.result


def test_acme_results_hold_nothing_of_globex(backend: DemoBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    call(backend, "payments.refund", {"order_id": "ORD-2005", "amount": 5}, tenant="globex")
    call(backend, "workspace.write_file", {"path": "src/globex_only.py", "content": "GLOBEX = 1\n"}, tenant="globex")
    monkeypatch.setenv("LOOPLEDGER_NOW", "2030-01-01T00:00:00+00:00")
    outcomes = [
        call(backend, "workspace.list", {"path": "."}),
        call(backend, "workspace.list", {"path": "src"}),
        call(backend, "workspace.read_file", {"path": "payments/config.json"}),
        call(backend, "tests.run", {"suite": "unit"}),
        call(backend, "orders.get_order", {"order_id": "ORD-1001"}),
    ]
    export = call(backend, "reports.export", {"query": "all orders", "delay_s": 0})
    done = backend.poll_work(export.work_id)
    assert done.outcome is not None and done.outcome.result["rows"] == 50
    for outcome in outcomes + [export, done.outcome]:
        assert not _leaks_globex(outcome), outcome


# --- validation, versions, unknown tools ----------------------------------------------------------


def test_refusals_before_execution(backend: DemoBackend) -> None:
    bad = call(backend, "payments.refund", {"order_id": "ORD-1042", "amount": -1, "note": "x"})
    assert (bad.outcome, bad.error_code) == ("validation_failed", "INVALID_ARGUMENT")
    assert len(bad.result["problems"]) == 2
    stale = backend.execute(replace(request("deploy.service", {"service": "api", "version": "1"}), version="v1"))
    assert (stale.outcome, stale.error_code) == ("unknown_or_disabled_tool", "VERSION_MISMATCH")
    assert call(backend, "ask_user", {"question": "Which order?"}).outcome == "unknown_or_disabled_tool"
    assert call(backend, "orders.cancel", {"order_id": "ORD-1001"}).outcome == "unknown_or_disabled_tool"


def test_every_outcome_is_in_the_taxonomy(backend: DemoBackend) -> None:
    seen = {call(backend, tool, args).outcome for tool, args, _, _ in SUCCESS_CASES}
    seen |= {call(backend, "payments.refund", {"order_id": "ORD-1010", "amount": 1},
                  faults=fault("payments.refund", kind)).outcome
             for kind in FAULT_KINDS if kind != "crash_after_dispatch"}
    assert seen <= OUTCOMES


# --- faults -------------------------------------------------------------------------------------------

REFUND = {"order_id": "ORD-1042", "amount": 25.0}


@pytest.mark.parametrize(
    ("kind", "outcome", "code", "executions"),
    [
        ("timeout_before_commit", "unknown_outcome", "TIMEOUT", 0),
        ("timeout_after_commit", "unknown_outcome", "TIMEOUT", 1),
        ("rate_limit", "cancelled", "RATE_LIMIT", 0),
        ("permission_denied", "permission_denied", "PERMISSION_DENIED", 0),
        ("state_conflict", "validation_failed", "STATE_CONFLICT", 0),
        ("fails", "validation_failed", "PROVIDER_ERROR", 0),
    ],
)
def test_fault_kinds_on_a_side_effect(backend: DemoBackend, kind: str, outcome: str, code: str, executions: int) -> None:
    got = call(backend, "payments.refund", REFUND, key="k", faults=fault("payments.refund", kind))
    assert (got.outcome, got.error_code, got.evidence, got.executed) == (outcome, code, (), False)
    assert backend.execution_count("k") == executions
    assert backend.delivery_count("k") == 1
    if kind == "rate_limit":
        assert got.retry_after_s == pytest.approx(0.05) and got.result["retry_after_s"] == got.retry_after_s
    if kind == "state_conflict":
        assert got.result["current_version"] == 1
    found = backend.lookup("k")
    if executions:
        assert found is not None and found.outcome == "success"
        assert found.evidence == ({"kind": "refund_confirmed", "subject": "ORD-1042"},)
    else:
        assert found is None


def test_faults_hit_only_their_tool_and_call(backend: DemoBackend) -> None:
    faults = (Fault("payments.refund", 2, "rate_limit"),)
    assert call(backend, "payments.refund", {"order_id": "ORD-1020", "amount": 1}, call=1, faults=faults).outcome == "success"
    assert call(backend, "orders.get_order", {"order_id": "ORD-1020"}, call=2, faults=faults).outcome == "success"
    assert call(backend, "payments.refund", {"order_id": "ORD-1020", "amount": 1}, call=2,
                faults=faults).error_code == "RATE_LIMIT"


def test_a_fault_fires_once_per_run_tool_and_call(backend: DemoBackend) -> None:
    faults = fault("orders.get_order", "timeout_before_commit")
    first = call(backend, "orders.get_order", {"order_id": "ORD-1021"}, faults=faults, run="r")
    again = call(backend, "orders.get_order", {"order_id": "ORD-1021"}, faults=faults, run="r")
    other_run = call(backend, "orders.get_order", {"order_id": "ORD-1021"}, faults=faults, run="r2")
    assert (first.outcome, again.outcome, other_run.outcome) == ("unknown_outcome", "success", "unknown_outcome")


@pytest.mark.parametrize("kind", ["timeout_before_commit", "timeout_after_commit", "rate_limit", "permission_denied",
                                  "state_conflict", "fails"])
def test_fault_kinds_on_a_read(backend: DemoBackend, kind: str) -> None:
    got = call(backend, "orders.get_order", {"order_id": "ORD-1030"}, key="rk", faults=fault("orders.get_order", kind))
    assert got.outcome != "success" and got.evidence == ()
    assert backend.lookup("rk") is None  # reads record nothing: a re-send is always safe


def test_fails_on_tests_run_reports_failing_tests(backend: DemoBackend) -> None:
    red = call(backend, "tests.run", {"suite": "unit"}, faults=fault("tests.run", "fails"))
    assert (red.outcome, red.status, red.error_code, red.evidence) == ("validation_failed", "failed", "TESTS_FAILED", ())
    assert red.result["failed"] == 3
    assert "FAILED tests/unit/test_refunds.py::test_refunds_0007" in red.result["log"]
    green = call(backend, "tests.run", {"suite": "unit"}, call=2, faults=fault("tests.run", "fails"))
    assert green.outcome == "success" and green.result["failed"] == 0


@pytest.mark.parametrize(("tool", "code"), [("workspace.write_file", "IO_ERROR"), ("orders.update_address", "TOOL_ERROR"),
                                            ("deploy.service", "DEPLOY_FAILED"), ("workspace.list", "IO_ERROR")])
def test_fails_on_other_tools(backend: DemoBackend, tool: str, code: str) -> None:
    args = {"workspace.write_file": {"path": "a.txt", "content": "a"}, "workspace.list": {"path": "."},
            "orders.update_address": {"order_id": "ORD-1031", "address": ADDRESS, "expected_version": 1},
            "deploy.service": {"service": "api", "version": "3"}}[tool]
    got = call(backend, tool, args, key="fk", faults=fault(tool, "fails"))
    assert (got.outcome, got.error_code, got.executed) == ("validation_failed", code, False)
    assert backend.execution_count("fk") == 0


def _crash(home: Path, tool: str, arguments: dict, key: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; sys.path.insert(0, sys.argv[1]); from backend_kit import crash_child; crash_child(*sys.argv[2:])"
    return subprocess.run([sys.executable, "-c", code, str(HERE), str(home), tool, json.dumps(arguments), key],
                          capture_output=True, text=True, timeout=60)


def test_crash_after_dispatch_kills_the_process_after_the_execution_is_recorded(home: Path) -> None:
    DemoBackend(home).close()  # seeded before the child, so the child only executes
    done = _crash(home, "workspace.write_file", {"path": "src/crash.txt", "content": "written before death"}, "ck")
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert (home / "workspaces" / "run-1" / "acme" / "src" / "crash.txt").read_text() == "written before death"
    with DemoBackend(home) as backend:
        assert backend.execution_count("ck") == 1
        found = backend.lookup("ck")
        assert found is not None and found.outcome == "success"
        assert found.evidence == ({"kind": "file_written", "subject": "src/crash.txt"},)
        # The engine's re-send after reconciliation would be deduplicated, not executed.
        again = call(backend, "workspace.write_file", {"path": "src/crash.txt", "content": "written before death"},
                     key="ck", call=2)
        assert again.deduplicated and backend.execution_count("ck") == 1


def test_crash_after_dispatch_on_a_refund(home: Path) -> None:
    done = _crash(home, "payments.refund", REFUND, "crash-refund")
    assert done.returncode == -signal.SIGKILL, done.stderr
    conn = raw(home)
    assert conn.execute("SELECT COUNT(*) FROM executions WHERE idempotency_key = 'crash-refund'").fetchone()[0] == 1
    assert conn.execute("SELECT refunded_cents FROM orders WHERE order_id = 'ORD-1042'").fetchone()[0] == 2500
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_deploy_cannot_confirm_a_timed_out_request(backend: DemoBackend) -> None:
    args = {"service": "checkout", "version": "7"}
    for key, kind in (("d-before", "timeout_before_commit"), ("d-after", "timeout_after_commit")):
        lost = call(backend, "deploy.service", args, key=key, faults=fault("deploy.service", kind), run=key)
        assert lost.outcome == "unknown_outcome"
        found = backend.lookup(key)
        assert found is not None and (found.outcome, found.error_code) == ("unknown_outcome", "OUTCOME_UNCONFIRMABLE")
    # A person chose to re-send: the provider deduplicates, and now it can tell.
    resent = call(backend, "deploy.service", args, key="d-after", call=2, run="d-after")
    assert resent.deduplicated and resent.outcome == "success"
    confirmed = backend.lookup("d-after")
    assert confirmed is not None and confirmed.outcome == "success"
    assert backend.execution_count("d-after") == 1


# --- idempotency keys and the executions table -------------------------------------------------------


def test_honoured_key_executes_once_and_replays_the_result(backend: DemoBackend, home: Path) -> None:
    args = {"path": "src/once.txt", "content": "v1"}
    first = call(backend, "workspace.write_file", args, key="w1")
    second = call(backend, "workspace.write_file", args, key="w1", call=2)
    assert first.executed and not first.deduplicated
    assert second.deduplicated and not second.executed
    assert second.result == json.loads(canonical_json(first.result)) and second.evidence == first.evidence
    assert (backend.execution_count("w1"), backend.delivery_count("w1")) == (1, 2)
    conflict = call(backend, "workspace.write_file", {"path": "src/once.txt", "content": "v2"}, key="w1")
    assert (conflict.outcome, conflict.error_code) == ("validation_failed", "IDEMPOTENCY_CONFLICT")
    assert (home / "workspaces" / "run-1" / "acme" / "src" / "once.txt").read_text() == "v1"


def test_refund_ignores_the_key_and_the_table_shows_it(backend: DemoBackend, home: Path) -> None:
    args = {"order_id": "ORD-1043", "amount": 10}
    first = call(backend, "payments.refund", args, key="r1", run="run-r")
    second = call(backend, "payments.refund", args, key="r1", call=2, run="run-r")
    assert first.executed and second.executed and not second.deduplicated
    assert second.result["refunded_total"] == 20
    conn = raw(home)
    rows = conn.execute("SELECT execution_no FROM executions WHERE idempotency_key = 'r1' ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == [1, 2]
    doubles = conn.execute("SELECT idempotency_key, COUNT(*) FROM executions GROUP BY 1 HAVING COUNT(*) > 1").fetchall()
    assert [tuple(r) for r in doubles] == [("r1", 2)]
    assert backend.side_effects("run-r") == {"payments.refund": 2}
    latest = backend.lookup("r1")
    assert latest is not None and latest.result["refunded_total"] == 20
    # A third send of the same full amount is refused on the balance: no
    # execution, but the delivery shows the engine sent it.
    third = call(backend, "payments.refund", {"order_id": "ORD-1043", "amount": 10}, key="r1", call=3, run="run-r")
    assert third.error_code == "AMOUNT_EXCEEDS_REMAINING"
    assert (backend.execution_count("r1"), backend.delivery_count("r1")) == (2, 3)


def test_database_enforces_one_execution_per_honoured_key(backend: DemoBackend, home: Path) -> None:
    call(backend, "orders.update_address", {"order_id": "ORD-1044", "address": ADDRESS, "expected_version": 1}, key="u1")
    conn = raw(home)
    row = dict(conn.execute("SELECT * FROM executions WHERE idempotency_key = 'u1'").fetchone())
    row.pop("execution_id")
    row["execution_no"] = 2
    with pytest.raises(Exception, match="UNIQUE"):
        conn.execute(f"INSERT INTO executions ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def test_threads_share_one_backend_without_lost_updates(backend: DemoBackend) -> None:
    def refund(i: int) -> None:
        assert call(backend, "payments.refund", {"order_id": "ORD-1045", "amount": 1}, key=f"t{i}").outcome == "success"

    threads = [threading.Thread(target=refund, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert call(backend, "orders.get_order", {"order_id": "ORD-1045"}).result["refunded"] == 10


def test_processes_racing_on_the_same_keys_execute_each_once(home: Path) -> None:
    keys = ",".join(f"race-{i}" for i in range(10))
    code = "import sys; sys.path.insert(0, sys.argv[1]); from backend_kit import race_child; race_child(*sys.argv[2:])"
    children = [subprocess.Popen([sys.executable, "-c", code, str(HERE), str(home), keys], stderr=subprocess.PIPE,
                                 text=True) for _ in range(3)]
    for child in children:
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
    conn = raw(home)
    counts = conn.execute("SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM executions").fetchone()
    assert tuple(counts) == (10, 10)
    assert conn.execute("SELECT COUNT(*) FROM deliveries").fetchone()[0] == 30
    assert conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 60


# --- background work -----------------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


def at(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    monkeypatch.setenv("LOOPLEDGER_NOW", (T0 + timedelta(seconds=seconds)).isoformat())


def test_export_runs_in_the_background_on_the_engine_clock(backend: DemoBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    at(monkeypatch, 0)
    accepted = call(backend, "reports.export", {"query": "paid orders"}, key="e1", run="run-e")
    assert (accepted.outcome, accepted.status, accepted.evidence) == ("background_accepted", "accepted", ())
    assert accepted.work_id and accepted.result["eta_s"] == 0.5
    assert backend.side_effects("run-e") == {"reports.export": 1}
    status = backend.poll_work(accepted.work_id)
    assert (status.state, status.progress, status.outcome) == ("running", 0.0, None)
    at(monkeypatch, 0.25)
    assert backend.poll_work(accepted.work_id).progress == pytest.approx(0.5)
    at(monkeypatch, 0.5)
    done = backend.poll_work(accepted.work_id)
    assert (done.state, done.progress) == ("succeeded", 1.0)
    assert done.outcome is not None and done.outcome.outcome == "success"
    assert done.outcome.evidence == ({"kind": "report_ready", "subject": accepted.work_id},)
    assert done.outcome.work_id == accepted.work_id
    assert done.outcome.result["rows"] == 50 and done.outcome.result["status_filter"] == "paid"
    at(monkeypatch, 99)
    assert backend.poll_work(accepted.work_id) == done  # finished once, read many times
    again = call(backend, "reports.export", {"query": "paid orders"}, key="e1", call=2, run="run-e")
    assert again.deduplicated and again.work_id == accepted.work_id
    found = backend.lookup("e1")
    assert found is not None and found.outcome == "background_accepted" and found.work_id == accepted.work_id


def test_export_fails_in_the_background(backend: DemoBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    at(monkeypatch, 0)
    accepted = call(backend, "reports.export", {"query": "q", "delay_s": 2}, faults=fault("reports.export", "fails"))
    assert accepted.outcome == "background_accepted"
    at(monkeypatch, 2)
    done = backend.poll_work(accepted.work_id)
    assert done.state == "failed" and done.outcome is not None
    assert (done.outcome.outcome, done.outcome.error_code, done.outcome.evidence) == ("validation_failed", "EXPORT_FAILED", ())


def test_cancel_work(backend: DemoBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    at(monkeypatch, 0)
    short = call(backend, "reports.export", {"query": "q", "delay_s": 5}).work_id
    finished = call(backend, "reports.export", {"query": "q", "delay_s": 1}).work_id
    long = call(backend, "reports.export", {"query": "q", "delay_s": 3600}).work_id
    at(monkeypatch, 2)
    assert backend.cancel_work(short) is True
    status = backend.poll_work(short)
    assert status.state == "cancelled" and status.outcome is not None and status.outcome.outcome == "cancelled"
    assert status.progress == pytest.approx(0.4)
    assert backend.cancel_work(short) is True  # asking again changes nothing
    assert backend.cancel_work(finished) is False  # it was done at t=1
    assert backend.poll_work(finished).state == "succeeded"
    assert backend.cancel_work(long) is None  # the batch cluster cannot confirm the stop
    assert backend.poll_work(long).state == "running"
    at(monkeypatch, 3600)
    assert backend.poll_work(long).state == "succeeded"  # the stop did not take
    with pytest.raises(UnknownWork):
        backend.poll_work("work-nope")
    with pytest.raises(UnknownWork):
        backend.cancel_work("work-nope")


# --- Fault.parse -----------------------------------------------------------------------------------------


def test_fault_parse() -> None:
    assert Fault.parse({"tool": "payments.refund", "call": 2, "kind": "timeout_after_commit"}, "s.yaml: faults[0]") == \
        Fault("payments.refund", 2, "timeout_after_commit")
    assert Fault.parse({"tool": "tests.run", "kind": "fails"}, "w").call == 1
    bad = [
        ("not a mapping", "w", "expected a mapping"),
        ({"tool": "payments.refund", "kind": "fails", "when": 1}, "w.when", "unknown field"),
        ({"tool": "payments.refnd", "kind": "fails"}, "w.tool", "expected a demo tool"),
        ({"tool": "ask_user", "kind": "fails"}, "w.tool", "expected a demo tool"),
        ({"tool": "payments.refund", "call": 0, "kind": "fails"}, "w.call", ">= 1"),
        ({"tool": "payments.refund", "call": True, "kind": "fails"}, "w.call", ">= 1"),
        ({"tool": "payments.refund", "call": "1", "kind": "fails"}, "w.call", ">= 1"),
        ({"tool": "payments.refund", "kind": "explodes"}, "w.kind", "timeout_before_commit"),
    ]
    for value, where, reason in bad:
        with pytest.raises(BadInput) as info:
            Fault.parse(value, "w")
        assert info.value.where == where and reason in info.value.reason


def test_parse_faults() -> None:
    assert parse_faults(None, "f") == ()
    parsed = parse_faults([{"tool": "tests.run", "kind": "fails"}, {"tool": "tests.run", "call": 2, "kind": "fails"}], "f")
    assert parsed == (Fault("tests.run", 1, "fails"), Fault("tests.run", 2, "fails"))
    with pytest.raises(BadInput, match=r"f\[1\]: tests.run call 1 already has a fault \(f\[0\]\)"):
        parse_faults([{"tool": "tests.run", "kind": "fails"}, {"tool": "tests.run", "kind": "rate_limit"}], "f")
    with pytest.raises(BadInput, match="expected a list"):
        parse_faults({"tool": "tests.run"}, "f")


def test_outcome_round_trips_through_json() -> None:
    outcome = ToolOutcome("success", "succeeded", {"a": [1, 2]}, ({"kind": "k", "subject": "s"},), None, None, "w", True)
    assert ToolOutcome.from_dict(json.loads(canonical_json(outcome.to_dict()))) == outcome


# --- result reduction ---------------------------------------------------------------------------------------


def test_tests_run_log_is_long_and_reduces_to_a_summary(backend: DemoBackend) -> None:
    for suite in ("unit", "contract"):
        for faulty in (False, True):
            outcome = call(backend, "tests.run", {"suite": suite}, faults=fault("tests.run", "fails") if faulty else ())
            log = outcome.result["log"]
            assert log.count("\n") > 2000
            summary = reduce_result("tests.run", outcome.result)
            assert summary == reduce_result("tests.run", json.loads(canonical_json(outcome.result)))
            counts = summary["summary"]
            assert (counts["passed"], counts["failed"], counts["skipped"]) == (
                outcome.result["passed"], outcome.result["failed"], outcome.result["skipped"])
            assert counts["total"] == outcome.result["total"]
            assert summary["full_artifact"] is None and summary["log_lines"] == log.count("\n")
            assert len(canonical_json(summary)) < 6000 < len(log)
            assert summary["last_lines"][-1].startswith("=") and len(summary["last_lines"]) == 20
            assert len(summary["failures"]) == outcome.result["failed"]
    red = reduce_result("tests.run", call(backend, "tests.run", {"suite": "unit"}, faults=fault("tests.run", "fails"),
                                          run="r9").result)
    assert red["failures"][0] == {"test": "tests/unit/test_refunds.py::test_refunds_0007",
                                  "error": "AssertionError: assert 2499 == 2500"}


def test_reduction_of_a_real_pytest_log() -> None:
    log = "\n".join([
        "tests/test_a.py::test_one PASSED                                    [ 33%]",
        "tests/test_a.py::test_two FAILED                                    [ 66%]",
        "tests/test_b.py::test_three ERROR                                   [100%]",
        "=================================== FAILURES ===================================",
        "___________________________________ test_two ___________________________________",
        "    def test_two():",
        ">       assert add(1, 1) == 3",
        "E       assert 2 == 3",
        "E        +  where 2 = add(1, 1)",
        "=========================== short test summary info ============================",
        "FAILED tests/test_a.py::test_two - assert 2 == 3",
        "ERROR tests/test_b.py::test_three - fixture 'db' not found",
        "============== 1 failed, 1 passed, 1 error in 0.12s (0:00:00) ===============",
    ])
    red = reduce_result("tests.run", {"suite": "unit", "log": log})
    assert red["summary"] == {"passed": 1, "failed": 1, "skipped": 0, "errors": 1, "total": 3, "duration_s": 0.12}
    assert red["failures"] == [{"test": "tests/test_a.py::test_two", "error": "assert 2 == 3"},
                               {"test": "tests/test_b.py::test_three", "error": "fixture 'db' not found"}]
    cut = reduce_result("tests.run", {"log": "\n".join(log.splitlines()[:3])})
    assert cut["summary"]["passed"] == 1 and cut["summary"]["failed"] == 1 and cut["summary"]["duration_s"] is None


def test_generic_reduction_keeps_small_results_and_shrinks_large_ones() -> None:
    small = {"order_id": "ORD-1", "amount": 25}
    assert reduce_result("orders.get_order", small) == {"reducer": "generic/1", "tool": "orders.get_order",
                                                        "result": small, "truncated": False, "full_artifact": None}
    big = {"path": "x", "content": "a" * 5000 + "TAIL", "entries": list(range(100))}
    red = reduce_result("workspace.read_file", big)
    assert red["truncated"] and red["full_artifact"] is None and red["size_bytes"] > 4096
    assert red["result"]["content"].endswith("TAIL") and "characters omitted" in red["result"]["content"]
    assert red["result"]["entries"][:20] == list(range(20)) and "80 more items" in red["result"]["entries"][20]
    assert len(canonical_json(red)) < 2000
    assert reduce_result("tests.run", {"error": "TIMEOUT"})["reducer"] == "generic/1"

