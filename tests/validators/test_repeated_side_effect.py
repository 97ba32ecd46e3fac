"""repeated_side_effect: a call that would do again what already took effect waits for a person."""

from __future__ import annotations

import pytest
from validators_helpers import call, make_input

from loopledger.validators import ParamError, Verdict, get_factory, load_suite

repeated = get_factory("repeated_side_effect")()
REFUND = {"order_id": "ORD-1042", "amount": 10.0}


def op(tool: str, arguments: dict, outcome: str, *, step: int = 1, operation_id: str = "run-1.s1.op1") -> dict:
    """An earlier operation of the run, with the args hash the proposal would give its arguments."""
    proposed = make_input([call(tool, arguments)]).proposed_calls[0]
    return {"operation_id": operation_id, "tool": tool, "step": step, "args_hash": proposed.args_hash,
            "outcome": outcome}


def test_the_same_refund_after_it_took_effect_is_asked_about():
    inp = make_input([call("payments.refund", {"amount": 10, "order_id": "ORD-1042"}, call_id="c9")], step=3,
                     facts={"operations": [op("payments.refund", REFUND, "success", step=2)]})
    d = repeated(inp)
    assert (d.verdict, d.code) == (Verdict.ASK, "repeated_side_effect")
    assert d.evidence["call_id"] == "c9" and d.evidence["operation_id"] == "run-1.s1.op1"
    assert "payments.refund with these arguments already took effect in this run" in d.message
    assert "at step 2, success" in d.message


@pytest.mark.parametrize("outcome", ["background_accepted", "unknown_outcome", "pending"])
def test_an_effect_that_may_have_happened_counts(outcome):
    inp = make_input([call("payments.refund", REFUND)], facts={"operations": [op("payments.refund", REFUND, outcome)]})
    assert repeated(inp).verdict is Verdict.ASK


@pytest.mark.parametrize("outcome", ["validation_failed", "permission_denied", "cancelled", "unknown_or_disabled_tool"])
def test_a_call_that_never_took_effect_may_be_tried_again(outcome):
    inp = make_input([call("payments.refund", REFUND)], facts={"operations": [op("payments.refund", REFUND, outcome)]})
    assert repeated(inp).verdict is Verdict.ACCEPT


def test_other_arguments_read_only_tools_and_exempt_tools_are_left_alone():
    earlier = [op("payments.refund", REFUND, "success"), op("orders.get_order", {"order_id": "ORD-1042"}, "success"),
               op("ask_user", {"question": "Which order?"}, "success")]
    for items in ([call("payments.refund", {"order_id": "ORD-1042", "amount": 5})],
                  [call("orders.get_order", {"order_id": "ORD-1042"})],
                  [call("ask_user", {"question": "Which order?"})]):
        assert repeated(make_input(items, facts={"operations": earlier})).verdict is Verdict.ACCEPT, items
    strict = get_factory("repeated_side_effect")(exempt=["payments.refund"])
    assert strict(make_input([call("payments.refund", REFUND)], facts={"operations": earlier[:1]})).verdict \
        is Verdict.ACCEPT


def test_two_equal_calls_in_one_answer_ask_about_the_second():
    d = repeated(make_input([call("payments.refund", REFUND, call_id="a"), call("payments.refund", REFUND, call_id="b")]))
    assert (d.verdict, d.code, d.evidence["call_id"], d.evidence["same_as"]) == (Verdict.ASK, "repeated_side_effect",
                                                                                "b", "a")


def test_bad_params_are_refused():
    with pytest.raises(ParamError):
        get_factory("repeated_side_effect")(exempt="ask_user")


def test_the_bundled_suites_hold_it():
    for name in ("default", "strict"):
        assert "repeated_side_effect" in [m.name for m in load_suite(name).members], name
