"""permission: allowed tools, forbidden paths on the canonical path, tenant scope, approval."""

from __future__ import annotations

from validators_helpers import call, make_input

from loopledger.validators import Verdict, canonical_proposal, get_factory

permission = get_factory("permission")()
CONTRACT = {"allowed_tools": ["workspace.*", "orders.get_order"], "forbidden_paths": ["payments/**"]}


def test_allowed_call_on_an_allowed_path_is_accepted():
    inp = make_input([call("workspace.write_file", {"path": "./exports/report.csv", "content": "x"})], contract=CONTRACT)
    assert permission(inp).verdict is Verdict.ACCEPT
    assert inp.proposed_calls[0].arguments["path"] == "exports/report.csv"


def test_dotdot_path_is_authorised_as_its_canonical_form_and_refused():
    inp = make_input(
        [call("workspace.write_file", {"path": "exports/../payments/config.json", "content": "x"})], contract=CONTRACT
    )
    d = permission(inp)
    assert (d.verdict, d.code) == (Verdict.REJECT, "forbidden_path")
    assert d.evidence["canonical_path"] == "payments/config.json"
    assert d.evidence["raw_path"] == "exports/../payments/config.json"
    assert d.evidence["pattern"] == "payments/**"


def test_paths_outside_the_workspace_are_rejected():
    for raw in ("/etc/passwd", "../other-tenant/x"):
        d = permission(make_input([call("workspace.read_file", {"path": raw})], contract=CONTRACT))
        assert (d.verdict, d.code) == (Verdict.REJECT, "path_outside_workspace"), raw


def test_tool_outside_the_contract_is_rejected():
    d = permission(make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": 25})], contract=CONTRACT))
    assert (d.verdict, d.code) == (Verdict.REJECT, "tool_not_allowed")


def test_no_allowed_list_means_any_registered_tool():
    d = permission(make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": 25})]))
    assert d.verdict is Verdict.ACCEPT


def test_resource_of_another_tenant_is_rejected():
    inp = make_input([call("orders.get_order", {"order_id": "ORD-2001"})])
    (proposed,) = canonical_proposal(inp.candidate, inp.context)
    owned = proposed.model_copy(update={"resources": tuple(r.model_copy(update={"tenant": "globex"}) for r in proposed.resources)})
    d = permission(make_input([call("orders.get_order", {"order_id": "ORD-2001"})], proposal=[owned.model_dump()]))
    assert (d.verdict, d.code) == (Verdict.REJECT, "tenant_scope")
    assert "globex" not in d.message and "globex" not in str(d.evidence)
    same = proposed.model_copy(update={"resources": tuple(r.model_copy(update={"tenant": "acme"}) for r in proposed.resources)})
    assert permission(make_input([call("orders.get_order", {"order_id": "ORD-1001"})], proposal=[same.model_dump()])).code == "ok"


def test_tool_needing_approval_asks():
    d = permission(make_input([call("deploy.service", {"service": "api", "version": "2"})]))
    assert (d.verdict, d.code) == (Verdict.ASK, "approval_required")
    d = permission(make_input([call("reports.export", {"query": "q"})], policy={"approval_required": ["reports.*"]}))
    assert d.code == "approval_required"


def test_reject_outranks_ask_and_keeps_the_other_issue():
    inp = make_input([call("deploy.service", {"service": "api", "version": "2"})], contract={"allowed_tools": []})
    d = permission(inp)
    assert d.code == "tool_not_allowed"
    assert [i["code"] for i in d.evidence["other_issues"]] == ["approval_required"]


def test_recorded_proposal_is_used_as_is():
    inp = make_input([call("workspace.read_file", {"path": "a.txt"})])
    assert inp.proposed_calls[0].args_hash  # derived
    assert make_input([call("workspace.read_file", {"path": "a.txt"})], proposal=[inp.proposed_calls[0].model_dump()]).proposed_calls == inp.proposed_calls
