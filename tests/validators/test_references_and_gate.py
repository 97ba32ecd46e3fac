"""references and completion_gate: claims against evidence; pending work blocks completion."""

from __future__ import annotations

from validators_helpers import call, claim, make_input, text

from loopledger.validators import Verdict, get_factory

references = get_factory("references")()
gate = get_factory("completion_gate")()

REFUND = {"evidence": [{"kind": "refund_confirmed", "subject": "ORD-1042", "operation_id": "op-2"}],
          "operations": [{"operation_id": "op-2", "tool": "payments.refund", "outcome": "success"}]}
CONTRACT = {"required_evidence": ["refund_confirmed"]}


def test_claim_citing_existing_evidence_is_accepted():
    items = [text("Refund issued."), claim("refund issued", "refund_confirmed:ORD-1042")]
    assert references(make_input(items, facts=REFUND)).verdict is Verdict.ACCEPT
    assert gate(make_input(items, facts=REFUND, contract=CONTRACT)).verdict is Verdict.ACCEPT


def test_claim_without_evidence():
    items = [text("Refund issued."), claim("refund issued")]
    d = references(make_input(items, facts=REFUND))
    assert (d.verdict, d.code) == (Verdict.REPAIR, "claim_without_evidence")
    assert d.evidence["available"] == ["refund_confirmed:ORD-1042"]
    d = gate(make_input(items, facts=REFUND, contract=CONTRACT))
    assert (d.verdict, d.code) == (Verdict.REJECT, "unsupported_claim")


def test_claim_citing_evidence_the_run_does_not_hold_is_rejected():
    items = [claim("tests pass", "tests_passed:contract")]
    d = references(make_input(items, facts=REFUND))
    assert (d.verdict, d.code) == (Verdict.REJECT, "evidence_not_found")
    assert d.evidence["missing"] == ["tests_passed:contract"]
    # kind:subject is only met by that subject
    d = references(make_input([claim("refund", "refund_confirmed:ORD-9999")], facts=REFUND))
    assert d.code == "evidence_not_found"


def test_final_answer_without_required_evidence_is_rejected():
    d = gate(make_input([text("Refund of 25.00 issued.")], contract=CONTRACT))
    assert (d.verdict, d.code) == (Verdict.REJECT, "missing_evidence")
    assert d.evidence["missing"] == ["refund_confirmed"]
    d = gate(make_input([text("done")], contract={"required_evidence": ["tests_passed:contract"]},
                        facts={"evidence": [{"kind": "tests_passed", "subject": "unit"}]}))
    assert d.evidence["missing"] == ["tests_passed:contract"]


def test_final_answer_while_a_tool_is_still_running_is_rejected():
    facts = dict(REFUND, operations=REFUND["operations"] + [
        {"operation_id": "op-3", "tool": "reports.export", "outcome": "background_accepted", "work_id": "w-1"}])
    d = gate(make_input([text("Report exported."), claim("refund", "refund_confirmed")], facts=facts, contract=CONTRACT))
    assert (d.verdict, d.code) == (Verdict.REJECT, "pending_work")
    assert d.evidence["pending"] == [{"kind": "background", "id": "w-1", "tool": "reports.export", "outcome": "background_accepted"}]
    done = dict(facts, operations=[dict(o, work_done=True) for o in facts["operations"]])
    assert gate(make_input([text("ok"), claim("refund", "refund_confirmed")], facts=done, contract=CONTRACT)).code == "ok"


def test_pending_approval_and_unknown_outcome_block_completion():
    facts = dict(REFUND, pending=[{"kind": "approval", "id": "apr-1", "tool": "deploy.service"}])
    assert gate(make_input([text("deployed")], facts=facts)).code == "pending_work"
    facts = dict(REFUND, operations=[{"operation_id": "op-9", "tool": "payments.refund", "outcome": "unknown_outcome"}])
    d = gate(make_input([text("refunded")], facts=facts))
    assert d.code == "pending_work" and d.evidence["pending"][0]["id"] == "op-9"


def test_pending_work_is_reported_first_so_the_engine_waits():
    facts = {"pending": [{"kind": "operation", "id": "op-1"}]}
    d = gate(make_input([text("done"), claim("x")], facts=facts, contract=CONTRACT))
    assert d.code == "pending_work"
    assert {i["code"] for i in d.evidence["other_issues"]} == {"missing_evidence", "unsupported_claim"}


def test_gate_ignores_candidates_that_are_not_final_answers():
    d = gate(make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": 25})], contract=CONTRACT,
                        facts={"pending": [{"kind": "operation", "id": "op-1"}]}))
    assert d.verdict is Verdict.ACCEPT


def test_gate_refuses_a_secret_in_the_final_answer():
    d = gate(make_input([text("key: sk-live-ABCDEFGHIJKLMNOPQRSTUV"), claim("r", "refund_confirmed")], facts=REFUND,
                        contract=CONTRACT))
    assert d.code == "sensitive_output"
    assert "sk-live" not in d.to_json()
