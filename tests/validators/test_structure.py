"""structure: trusted finish, no partial items, stop signal agrees with the items."""

from __future__ import annotations

import pytest
from validators_helpers import call, claim, make_input, text

from loopledger.validators import Verdict, get_factory

structure = get_factory("structure")()


def test_accepts_a_complete_tool_call_and_a_final_answer():
    assert structure(make_input([call("orders.get_order", {"order_id": "ORD-1042"})])).verdict is Verdict.ACCEPT
    assert structure(make_input([text("done"), claim("refund issued", "refund_confirmed")])).code == "ok"


def test_half_received_arguments_on_an_incomplete_stream_are_rejected():
    d = structure(make_input([call("payments.refund", raw='{"order_id": "ORD-')], finish_reason="incomplete"))
    assert (d.verdict, d.code) == (Verdict.REJECT, "incomplete_stream")
    assert d.evidence["partial_calls"] == ["c1"]


@pytest.mark.parametrize(
    ("finish", "code"), [("length", "truncated"), ("content_filter", "content_filtered"), ("error", "provider_error")]
)
def test_untrusted_finishes_are_rejected_even_with_whole_items(finish, code):
    d = structure(make_input([text("Refund issued.")], finish_reason=finish))
    assert (d.verdict, d.code) == (Verdict.REJECT, code)


def test_stop_signal_contradicting_the_items_is_a_protocol_error():
    d = structure(make_input([call("orders.get_order", {"order_id": "ORD-1042"})], finish_reason="stop"))
    assert (d.verdict, d.code) == (Verdict.REJECT, "protocol_error")
    d = structure(make_input([text("all done")], finish_reason="tool_calls"))
    assert (d.verdict, d.code) == (Verdict.REJECT, "protocol_error")


def test_duplicate_call_ids_are_a_protocol_error():
    items = [call("orders.get_order", {"order_id": "ORD-1"}), call("orders.get_order", {"order_id": "ORD-2"})]
    d = structure(make_input(items))
    assert d.code == "protocol_error" and "duplicate" in d.message


def test_unparseable_arguments_on_a_complete_stream_are_repaired():
    d = structure(make_input([call("payments.refund", raw='{"order_id": "ORD-')]))
    assert (d.verdict, d.code) == (Verdict.REPAIR, "unparseable_arguments")
    assert "ORD" not in str(d.evidence)


def test_empty_candidate_is_repaired():
    assert structure(make_input([], finish_reason="stop")).code == "empty_candidate"
