"""tool_exists, tool_version, tool_args_schema."""

from __future__ import annotations

from validators_helpers import DEMO_TOOLS, call, make_input

from loopledger.validators import Verdict, get_factory
from loopledger.validators._tool_args_schema import _compiled, compiled_schema

exists = get_factory("tool_exists")()
version = get_factory("tool_version")()
schema = get_factory("tool_args_schema")()


def test_known_tool_exists_and_unknown_is_repaired_with_known_names():
    assert exists(make_input([call("orders.get_order", {"order_id": "ORD-1042"})])).verdict is Verdict.ACCEPT
    d = exists(make_input([call("orders.get_ordr", {"order_id": "ORD-1042"})]))
    assert (d.verdict, d.code) == (Verdict.REPAIR, "unknown_tool")
    assert "orders.get_order" in d.evidence["known"]


def test_disabled_tool_is_rejected():
    tools = [dict(t, enabled=False) if t["name"] == "payments.refund" else t for t in DEMO_TOOLS]
    d = exists(make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": 25})], tools=tools))
    assert (d.verdict, d.code) == (Verdict.REJECT, "tool_disabled")


def test_stale_version_is_rejected_never_upgraded():
    d = version(make_input([call("deploy.service@v1", {"service": "api", "version": "1.2"})]))
    assert (d.verdict, d.code) == (Verdict.REJECT, "stale_tool_version")
    assert d.evidence == {"call_id": "c1", "tool": "deploy.service", "proposed": "v1", "registry": ["v2"]}
    d = version(make_input([call("deploy.service", {"service": "api", "version": "1.2"}, version="v1")]))
    assert d.code == "stale_tool_version"


def test_current_or_unversioned_calls_pass_version_check():
    assert version(make_input([call("deploy.service@v2", {"service": "api", "version": "1"})])).code == "ok"
    assert version(make_input([call("deploy.service", {"service": "api", "version": "1"})])).code == "ok"


def test_schema_accepts_valid_arguments():
    d = schema(make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": 25.0})]))
    assert d.verdict is Verdict.ACCEPT


def test_schema_failure_names_the_json_path():
    d = schema(make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": "25"})]))
    assert (d.verdict, d.code) == (Verdict.REPAIR, "invalid_arguments")
    assert d.evidence["path"] == "$.amount"
    d = schema(make_input([call("payments.refund", {"order_id": "ORD-1042"})]))
    assert d.evidence["path"] == "$.amount" and d.evidence["errors"][0]["keyword"] == "required"
    tools = [{"name": "t", "schema": {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}}]
    d = schema(make_input([call("t", {"items": [{"n": 1}, {"n": "x"}]})], tools=tools))
    assert d.evidence["path"] == "$.items[1].n"


def test_schema_errors_are_capped_and_counted():
    capped = get_factory("tool_args_schema")(max_errors=1)
    d = capped(make_input([call("payments.refund", {"order_id": 1, "amount": "x", "extra": True})]))
    assert len(d.evidence["errors"]) == 1 and d.evidence["error_count"] == 3


def test_invalid_registry_schema_is_rejected_not_blamed_on_the_model():
    tools = [{"name": "broken", "schema": {"type": "nonsense"}}]
    d = schema(make_input([call("broken", {})], tools=tools))
    assert (d.verdict, d.code) == (Verdict.REJECT, "invalid_tool_schema")


def test_schemas_are_compiled_once_per_hash():
    inp1 = make_input([call("orders.get_order", {"order_id": "ORD-1042"})])
    inp2 = make_input([call("orders.get_order", {"order_id": "ORD-1043"})])
    spec1 = inp1.context.tool_index["orders.get_order"][0]
    spec2 = inp2.context.tool_index["orders.get_order"][0]
    assert spec1 is not spec2 and spec1.schema_hash == spec2.schema_hash
    assert compiled_schema(spec1) is compiled_schema(spec2)
    assert spec1.schema_hash in _compiled


def test_unknown_tools_and_raw_arguments_are_left_to_other_validators():
    assert schema(make_input([call("nope", {"a": 1})])).code == "ok"
    assert schema(make_input([call("payments.refund", raw="{")])).code == "ok"
