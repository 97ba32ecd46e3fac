"""The conversation a real model is sent: rebuilt from the context chain and
reshaped into turns every provider accepts."""

from __future__ import annotations

import json

import pytest

from loopledger.engine._conversation import NOT_RUN, ToolNames, conversation, offered_tools, provider_tool_name, turns
from loopledger.engine._tools import tool_registry_snapshot


def call(call_id: str, name: str = "orders.get_order", **arguments: str) -> dict:
    return {"type": "tool_call", "call_id": call_id, "name": name, "version": None, "arguments": arguments}


def test_the_chain_is_followed_back_to_the_first_context() -> None:
    contexts = {
        "c1": {"previous_context": None, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "g"}]},
        "c2": {"previous_context": "c1", "messages": [{"role": "assistant", "items": [call("a")]}]},
        "c3": {"previous_context": "c2", "messages": [{"role": "user", "content": "more"}]},
    }
    assert [m["role"] for m in conversation("c3", contexts.__getitem__)] == ["system", "user", "assistant", "user"]
    assert conversation(None, contexts.__getitem__) == []
    contexts["c1"]["previous_context"] = "c3"
    with pytest.raises(ValueError, match="loops"):
        conversation("c3", contexts.__getitem__)


def test_only_the_last_attempt_of_a_step_is_kept_and_every_call_is_answered() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "g"},
        # attempt 1 broke mid-arguments, attempt 2 counted
        {"role": "assistant", "items": [{"type": "tool_call", "call_id": "x", "name": "orders.get_order",
                                         "raw_arguments": '{"order'}]},
        {"role": "assistant", "items": [call("a", order_id="ORD-1042"), call("b", order_id="ORD-9")]},
        {"role": "tool", "call_id": "a", "tool": "orders.get_order", "outcome": "success", "content": {"ok": 1}},
        {"role": "user", "content": [{"validator": "tool_args_schema", "code": "schema", "verdict": "repair",
                                      "message": "bad order id"}]},
        {"role": "tool", "call_id": "a", "tool": "orders.get_order", "outcome": "success", "content": {"late": 1}},
    ]
    out = turns(messages)
    assert [t.role for t in out] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert [c.call_id for c in out[2].calls] == ["a", "b"]
    assert (out[3].call_id, out[3].error) == ("a", False)
    assert (out[4].call_id, out[4].text, out[4].error) == ("b", NOT_RUN, True)
    # The feedback and a second result under an answered id become one user turn.
    assert "tool_args_schema: schema" in out[5].text and "Update on tool call a" in out[5].text


def test_a_call_of_a_stale_version_is_shown_to_the_model_as_it_wrote_it() -> None:
    """The item keeps the version apart from the name; the model's own turn
    names the tool as it asked for it, so the stale-version feedback that
    follows reads against what it did."""
    messages = [
        {"role": "user", "content": "deploy"},
        {"role": "assistant", "items": [{"type": "tool_call", "call_id": "d", "name": "deploy.service",
                                         "version": "v1", "arguments": {}},
                                        {"type": "tool_call", "call_id": "e", "name": "orders.get_order",
                                         "version": None, "arguments": {}}]},
    ]
    (_, assistant, *_) = turns(messages)
    assert [c.name for c in assistant.calls] == ["deploy.service@v1", "orders.get_order"]


def test_dotted_tool_names_map_reversibly_and_only_allowed_tools_are_offered() -> None:
    assert provider_tool_name("orders.get_order") == "orders__get_order"
    assert provider_tool_name("deploy.service@v1") == "deploy__service_v1"
    context = {"tools": tool_registry_snapshot(),
               "contract": {"allowed_tools": ["orders.*", "ask_user"]}}
    tools, names = offered_tools(context)
    assert [t.name for t in tools] == ["orders__get_order", "orders__update_address", "ask_user"]
    assert names.registry("orders__update_address") == "orders.update_address"
    assert names.registry("payments__refund") == "payments.refund"  # not offered: mapped back by rule
    assert all("$schema" not in t.schema for t in tools)
    # No reference to a schema elsewhere goes to a provider (it fetches nothing).
    ask = next(t for t in tools if t.name == "ask_user")
    assert "://" not in json.dumps(ask.schema) and ask.schema["properties"]["schema"] == {"type": "object"}
    assert "side effects" not in ask.description and "JSON Schema" in ask.description
    # Only schema keywords are touched: names and data stay as they are.
    from loopledger.engine._conversation import _for_provider

    assert _for_provider({"$schema": "x", "properties": {"$schema": {"type": "string"}}, "enum": [{"$ref": "http://a"}],
                          "items": {"$ref": "#/$defs/a"}, "allOf": [{"$ref": "urn:other"}]}) == {
        "properties": {"$schema": {"type": "string"}}, "enum": [{"$ref": "http://a"}], "items": {"$ref": "#/$defs/a"},
        "allOf": [{}]}
    clash = ToolNames()
    clash.add("a.b")
    with pytest.raises(ValueError, match="same name"):
        clash.add("a__b")


def test_claims_are_read_from_their_own_lines_of_an_answer() -> None:
    from loopledger.engine._conversation import claims_in

    answer = ("Refund issued.\n"
              "Claim: refund issued for ORD-1042 (evidence: refund_confirmed:ORD-1042, order_found)\n"
              "  - **Claim:** the order is paid (evidence: `order_found:ORD-1042`)\n"
              "CLAIM: nothing cited\n"
              "The claim: is not at the start of its line.\n"
              "Claim:\n"
              "Claim: (evidence: order_found)\n")
    assert claims_in(answer) == [
        {"type": "claim", "text": "refund issued for ORD-1042", "evidence": ["refund_confirmed:ORD-1042", "order_found"]},
        {"type": "claim", "text": "the order is paid", "evidence": ["order_found:ORD-1042"]},
        {"type": "claim", "text": "nothing cited", "evidence": []},
    ]
    assert claims_in("No claims here.") == []
