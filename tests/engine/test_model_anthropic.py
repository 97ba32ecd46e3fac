"""``anthropic:MODEL`` end to end: the real ``anthropic`` SDK against a
Messages server on 127.0.0.1 speaking the streaming wire format (named SSE
events ``message_start``, ``content_block_start``/``delta``/``stop`` with
``text_delta`` and ``input_json_delta``, ``message_delta`` with
``stop_reason`` and usage, ``message_stop``, ``ping`` and ``error``),
through ``loopledger run``; each case checks the candidates, attempts and
reason the journal recorded."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")

from loopledger.engine._anthropic import error_table, translate_error  # noqa: E402
from loopledger.engine._errors import ModelError  # noqa: E402
from loopledger.engine._vendor import nearest_rule  # noqa: E402
from provider_kit import (  # noqa: E402
    SCENARIO, ProviderServer, Reply, files_holding, items, paced, run_scenario, sse)

ROUTE = "anthropic:test-model"


@pytest.fixture
def server():
    s = ProviderServer()
    yield s
    s.close()


@pytest.fixture
def env(server: ProviderServer) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "test-key", "LOOPLEDGER_PRICES": ""}


# -- the wire format ------------------------------------------------------------------


def ev(kind: str, **data: Any) -> bytes:
    return sse({"type": kind, **data}, event=kind)


def start(input_tokens: int = 30, cache_read: int = 0) -> bytes:
    return ev("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "test-model",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": 0}})


def text_block(index: int, words: str) -> list[bytes]:
    deltas = [ev("content_block_delta", index=index, delta={"type": "text_delta", "text": w + " "})
              for w in words.split()]
    return [ev("content_block_start", index=index, content_block={"type": "text", "text": ""}), *deltas,
            ev("content_block_stop", index=index)]


def tool_block(index: int, call_id: str, name: str, arguments: str, size: int = 3,
               stop: bool = True) -> list[bytes]:
    deltas = [ev("content_block_delta", index=index,
                 delta={"type": "input_json_delta", "partial_json": arguments[i:i + size]})
              for i in range(0, len(arguments), size)]
    return [ev("content_block_start", index=index,
               content_block={"type": "tool_use", "id": call_id, "name": name, "input": {}}),
            *deltas, *([ev("content_block_stop", index=index)] if stop else [])]


def message(*blocks: bytes, stop_reason: str | None, output_tokens: int = 12) -> Reply:
    tail = [ev("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": None},
               usage={"output_tokens": output_tokens}), ev("message_stop")] if stop_reason else []
    return Reply(frames=[start(), ev("ping"), *blocks, *tail])


def text(words: str) -> Reply:
    return message(*text_block(0, words), stop_reason="end_turn")


def lookup(order: str = "ORD-1042", call_id: str = "toolu_a") -> Reply:
    return message(*text_block(0, "Looking it up."),
                   *tool_block(1, call_id, "orders__get_order", json.dumps({"order_id": order})),
                   stop_reason="tool_use")


def error_body(kind: str, message_text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message_text}}


# -- cases ----------------------------------------------------------------------------


def test_plain_text_is_a_trusted_stop_with_usage_and_cost(tmp_path: Path, server, env) -> None:
    server.script(Reply(frames=[start(input_tokens=20, cache_read=100), *text_block(0, "Hello there."),
                                ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 7}),
                                ev("message_stop")]))
    scenario = {**SCENARIO, "contract": {"goal": "Say hello.", "allowed_tools": ["orders.get_order"]}}
    rec = run_scenario(tmp_path, "anthropic:claude-sonnet-4-20250514", env, scenario)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    [cand] = rec.candidates
    assert cand["finish_reason"] == "stop"
    assert items(cand["items_json"]) == [{"type": "text", "text": "Hello there. "}]
    assert (cand["tokens_in"], cand["tokens_out"]) == (120, 7)  # cache reads count as input
    assert cand["cost_usd"] == pytest.approx((20 * 3.00 + 100 * 0.30 + 7 * 15.00) / 1e6)  # docs/models.md
    assert len(rec.bodies[0]["prompt_hash"]) == 64
    sent = server.requests[0]
    assert server.paths[0].endswith("/v1/messages") and sent["stream"] is True and sent["max_tokens"] == 4096
    assert sent["system"].startswith("You are") and sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Say hello.\nIn the final answer, state each claim on "
                                                              "its own line as: Claim: WHAT (evidence: KIND:SUBJECT, ...)."}]}]
    assert [t["name"] for t in sent["tools"]] == ["orders__get_order"]
    assert "$schema" not in sent["tools"][0]["input_schema"]


def test_claims_stated_in_the_answer_are_claim_items(tmp_path, server, env) -> None:
    """As with OpenAI: a final answer's ``Claim: ... (evidence: ...)`` lines
    are claim items, whichever deltas carry them; a tool-use turn's text is
    not searched."""
    answer = "ORD-1042 is paid.\nClaim: ORD-1042 is paid (evidence: order_found:ORD-1042)"
    deltas = [ev("content_block_delta", index=0, delta={"type": "text_delta", "text": answer[i:i + 7]})
              for i in range(0, len(answer), 7)]
    server.script(message(*text_block(0, "Claim: looking (evidence: nothing)"),
                          *tool_block(1, "toolu_a", "orders__get_order", json.dumps({"order_id": "ORD-1042"})),
                          stop_reason="tool_use"),
                  message(ev("content_block_start", index=0, content_block={"type": "text", "text": ""}), *deltas,
                          ev("content_block_stop", index=0), stop_reason="end_turn"))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    first, final = (items(c["items_json"]) for c in rec.candidates)
    assert [i["type"] for i in first] == ["text", "tool_call"]
    assert final == [{"type": "text", "text": answer},
                     {"type": "claim", "text": "ORD-1042 is paid", "evidence": ["order_found:ORD-1042"]}]


def test_tool_use_split_across_many_deltas_runs_and_its_result_goes_back_by_id(tmp_path, server, env) -> None:
    server.script(lookup(), text("ORD-1042 is paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    first = items(rec.candidates[0]["items_json"])
    assert first == [{"type": "text", "text": "Looking it up. "},
                     {"type": "tool_call", "call_id": "toolu_a", "name": "orders.get_order", "version": None,
                      "arguments": {"order_id": "ORD-1042"}}]
    second = server.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    use = second[1]["content"][-1]
    assert (use["type"], use["id"], use["name"], use["input"]) == (
        "tool_use", "toolu_a", "orders__get_order", {"order_id": "ORD-1042"})
    result = second[2]["content"][0]
    assert (result["type"], result["tool_use_id"], result["is_error"]) == ("tool_result", "toolu_a", False)
    assert len(server.requests) == 2 and len(rec.operations) == 1


def test_parallel_tool_use_blocks_are_assembled_by_index(tmp_path, server, env) -> None:
    a = tool_block(0, "toolu_a", "orders__get_order", json.dumps({"order_id": "ORD-1042"}))
    b = tool_block(1, "toolu_b", "orders__get_order", json.dumps({"order_id": "ORD-1043"}))
    server.script(message(*a, *b, stop_reason="tool_use"), text("Both are paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    calls = items(rec.candidates[0]["items_json"])
    assert [(c["call_id"], c["arguments"]) for c in calls] == [
        ("toolu_a", {"order_id": "ORD-1042"}), ("toolu_b", {"order_id": "ORD-1043"})]
    results = server.requests[1]["messages"][2]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_a", "toolu_b"]


def test_stream_cut_mid_input_is_an_incomplete_attempt_then_a_new_one(tmp_path, server, env) -> None:
    cut = tool_block(0, "toolu_a", "orders__get_order", json.dumps({"order_id": "ORD-1042"}), stop=False)[:3]
    server.script(Reply(frames=[start(), *cut], cut=True), lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    broken = rec.candidates[0]
    assert (broken["step"], broken["attempt"], broken["finish_reason"]) == (1, 1, "incomplete")
    [partial] = items(broken["items_json"])
    assert partial["raw_arguments"] == '{"orde' and "arguments" not in partial
    assert ("MODEL_RUNNING", "MODEL_RUNNING", 1, 2) in rec.transitions()
    # The half-received call never reaches a tool: its one result says so.
    assert sorted((op["outcome"], op["dispatch_count"]) for op in rec.operations) == [("cancelled", 0), ("success", 1)]
    assert server.requests[1]["messages"] == server.requests[0]["messages"]


def test_stream_ending_before_message_stop_is_incomplete(tmp_path, server, env) -> None:
    no_stop = Reply(frames=[start(), *tool_block(0, "toolu_a", "orders__get_order", '{"order_id": "ORD-1042"}'),
                            ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 5})])
    server.script(no_stop, lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert rec.candidates[0]["finish_reason"] == "incomplete"
    assert rec.run.state.value == "SUCCEEDED"
    assert sorted((op["outcome"], op["dispatch_count"]) for op in rec.operations) == [("cancelled", 0), ("success", 1)]


def test_overloaded_error_event_fails_the_attempt_and_the_engine_retries(tmp_path, server, env) -> None:
    broken = Reply(frames=[start(), *text_block(0, "Let me"), sse(error_body("overloaded_error", "Overloaded"),
                                                                  event="error")])
    server.script(broken, lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.candidates[0]["finish_reason"] == "error"
    assert rec.bodies[0]["error"]["code"] == "overloaded" and rec.bodies[0]["error"]["retryable"] is True
    assert items(rec.candidates[0]["items_json"]) == [{"type": "text", "text": "Let me "}]


def test_429_with_retry_after_backs_off_then_retries(tmp_path, server, env) -> None:
    limited = Reply(429, body=error_body("rate_limit_error", "Number of requests has exceeded your rate limit"),
                    headers={"retry-after": "0.1"})
    server.script(limited, lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.bodies[0]["error"]["code"] == "rate_limited"
    retry = next(e for e in rec.events if e.kind == "transition" and e.payload.get("retry_of"))
    assert retry.payload["backoff_s"] == pytest.approx(0.1)
    assert len(server.requests) == 3  # the SDK's own retries are off


def test_500_on_every_attempt_fails_the_run_after_the_engines_attempts(tmp_path, server, env) -> None:
    server.script(*[Reply(500, body=error_body("api_error", "Internal server error"))] * 3)
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert [(c["attempt"], c["finish_reason"]) for c in rec.candidates] == [(1, "error"), (2, "error"), (3, "error")]
    assert len(server.requests) == 3


def test_invalid_request_fails_the_run_without_a_retry(tmp_path, server, env) -> None:
    server.script(Reply(400, body=error_body("invalid_request_error", "messages: roles must alternate")))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert len(server.requests) == 1 and rec.bodies[0]["error"]["code"] == "bad_request"


@pytest.mark.parametrize("reply", [
    pytest.param(message(*tool_block(0, "toolu_a", "orders__get_order", '{"order_id": "ORD-1042"}'),
                         stop_reason="end_turn"), id="end-turn-with-tool-use"),
    pytest.param(message(*text_block(0, "All done."), stop_reason="tool_use"), id="tool-use-without-any"),
])
def test_stop_reason_contradicting_the_content_is_a_protocol_error(tmp_path, server, env, reply) -> None:
    server.script(reply)
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "protocol_error"), rec.output
    # Nothing was sent; each call proposed has its one result all the same.
    proposed = [i["call_id"] for c in rec.candidates for i in items(c["items_json"]) if i["type"] == "tool_call"]
    assert [(op["call_id"], op["outcome"], op["dispatch_count"]) for op in rec.operations] == [
        (call_id, "cancelled", 0) for call_id in proposed]


@pytest.mark.parametrize(("stop_reason", "status", "reason"), [
    ("refusal", "POLICY_STOPPED", "policy"),
    ("max_tokens", "FAILED", "model_error"),  # three attempts cut by the length limit
])
def test_refusal_and_max_tokens_are_mapped_explicitly(tmp_path, server, env, stop_reason, status, reason) -> None:
    server.script(*[message(*text_block(0, "Partial"), stop_reason=stop_reason)] * 3)
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == (status, reason), rec.output
    assert rec.candidates[0]["finish_reason"] == {"refusal": "content_filter", "max_tokens": "length"}[stop_reason]


def test_a_retry_in_the_step_asks_for_no_more_tokens_than_the_run_has_left(tmp_path, server, env) -> None:
    """``max_tokens`` is capped by the run's remaining budget as it is when
    each attempt begins: a cut attempt's tokens are counted before the next
    (the context's figure is frozen with the step's first attempt)."""
    server.script(message(*text_block(0, "Partial"), stop_reason="max_tokens", output_tokens=4000), text("Done."))
    scenario = {**SCENARIO, "contract": {"goal": "Say hello.", "allowed_tools": ["orders.get_order"]},
                "budgets": {"max_tokens": 5000}}
    rec = run_scenario(tmp_path, ROUTE, env, scenario)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert [r["max_tokens"] for r in server.requests] == [4096, 5000 - 30 - 4000]


# -- errors -----------------------------------------------------------------------------


def _attribute(module: Any, name: str) -> Any:
    try:
        return getattr(module, name)
    except Exception:  # noqa: BLE001 - module-level client proxies build a client on access
        return None


def sdk_exceptions() -> list[type[BaseException]]:
    exported = [_attribute(anthropic, name) for name in dir(anthropic) if not name.startswith("_")]
    # type(obj), not inspect.isclass: the SDK's lazy module proxies build a client when asked their __class__.
    found = {obj for obj in exported if issubclass(type(obj), type) and issubclass(obj, BaseException)}
    found |= {obj for obj in vars(anthropic._exceptions).values()
              if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("anthropic")}
    return sorted(found, key=lambda c: c.__name__)


def test_every_exception_the_sdk_exports_is_mapped() -> None:
    table = error_table()
    classes = sdk_exceptions()
    assert len(classes) > 10
    unmapped = [c.__name__ for c in classes if nearest_rule(c, table) is None]
    assert unmapped == []
    generic = [c.__name__ for c in classes if nearest_rule(c, table)[0] is anthropic.AnthropicError
               and c is not anthropic.AnthropicError]
    assert generic == [], "map these in engine/_anthropic.py ERROR_RULES"
    for cls in classes:
        error = translate_error(cls.__new__(cls))
        assert isinstance(error, ModelError) and isinstance(error.retryable, bool)


def test_spend_limits_are_not_retried_but_ramp_limits_are() -> None:
    table = error_table()
    for name, retryable in (("ContractSpendLimitReachedError", False), ("RampLimitExceededError", True),
                            ("OverloadedError", True), ("CMEKKeyDisabledError", False)):
        cls = getattr(anthropic, name, None)
        if cls is None:
            continue  # an older SDK without it
        error = translate_error(cls.__new__(cls))
        assert error.retryable is retryable, name
        assert nearest_rule(cls, table) is not None


@pytest.mark.parametrize("code", ["contract_spend_limit_reached", "enforced_spend_limit_reached",
                                  "linked_organization_spend_limit_reached"])
def test_a_spend_limit_is_read_from_the_body_whatever_class_the_sdk_raised(code: str) -> None:
    """An SDK without the spend-limit classes raises a plain RateLimitError;
    the body's ``error.details.error_code`` still says that no wait helps."""
    def rate_limited(body: dict) -> anthropic.RateLimitError:
        # Built without its HTTP response (the SDK's own HTTP library differs
        # between its versions): the translation reads the body and status.
        exc = anthropic.RateLimitError.__new__(anthropic.RateLimitError)
        exc.message, exc.body, exc.status_code, exc.response = "rate limited", body, 429, None
        return exc

    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "Spend limit reached",
                                       "details": {"error_code": code}}}
    error = translate_error(rate_limited(body))
    assert (error.code, error.retryable) == ("spend_limit", False)
    plain = translate_error(rate_limited({"type": "error", "error": {"type": "rate_limit_error"}}))
    assert plain.retryable is True


def test_missing_key_is_bad_input_naming_the_variable(tmp_path) -> None:
    rec = run_scenario(tmp_path, ROUTE, {"ANTHROPIC_API_KEY": "", "ANTHROPIC_BASE_URL": ""})
    assert rec.exit_code == 2 and "ANTHROPIC_API_KEY" in rec.output


# -- slow streams -----------------------------------------------------------------------

#: A scenario a plain text answer completes.
HELLO = {**SCENARIO, "contract": {"goal": "Say hello.", "allowed_tools": ["orders.get_order"]}}


def pings(count: int) -> Reply:
    return message(*[ev("ping")] * count, *text_block(0, "Hello."), stop_reason="end_turn")


def test_a_slow_stream_is_cut_at_the_runs_deadline(tmp_path, server, env) -> None:
    server.script(paced(server, pings(16), 0.25))  # 4 s in all
    scenario = {**HELLO, "budgets": {**HELLO["budgets"], "deadline_s": 1.5}}
    rec = run_scenario(tmp_path, ROUTE, env, scenario)
    assert (rec.run.state.value, rec.run.reason) == ("BUDGET_EXHAUSTED", "deadline"), rec.output
    [cut] = rec.candidates
    assert cut["finish_reason"] == "incomplete" and items(cut["items_json"]) == []
    assert rec.bodies[0]["error"]["code"] == "timeout" and rec.bodies[0]["error"]["retryable"] is True
    assert cut["tokens_in"] == 30  # message_start's input was paid for
    assert len(server.requests) == 1


def test_a_slow_stream_is_cut_at_the_model_timeout_and_retried(tmp_path, server, env) -> None:
    server.script(paced(server, pings(16), 0.25), text("Hello."))
    rec = run_scenario(tmp_path, ROUTE, {**env, "LOOPLEDGER_MODEL_TIMEOUT_S": "1"}, HELLO)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert [c["finish_reason"] for c in rec.candidates] == ["incomplete", "stop"]
    assert rec.bodies[0]["error"]["code"] == "timeout" and rec.bodies[0]["error"]["retryable"] is True
    assert len(server.requests) == 2


# -- errors on the wire -------------------------------------------------------------------


def test_429_spend_limit_fails_the_run_without_a_retry(tmp_path, server, env) -> None:
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "Spend limit reached",
                                       "details": {"error_code": "contract_spend_limit_reached"}}}
    server.script(Reply(429, body=body), lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert rec.bodies[0]["error"]["code"] == "spend_limit" and rec.bodies[0]["error"]["retryable"] is False
    assert len(server.requests) == 1


def test_an_event_that_is_not_json_is_a_bad_response_and_retried(tmp_path, server, env) -> None:
    server.script(Reply(frames=[b"event: message_start\ndata: {not json\n\n"]), text("Hello."))
    rec = run_scenario(tmp_path, ROUTE, env, HELLO)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.candidates[0]["finish_reason"] == "error"
    assert rec.bodies[0]["error"]["code"] == "bad_response" and rec.bodies[0]["error"]["retryable"] is True
    assert len(server.requests) == 2


def test_a_key_the_server_echoes_in_its_error_is_never_recorded(tmp_path, server, env) -> None:
    key = "sk-ant-ECHOED-0123456789"
    server.script(Reply(401, body=error_body("authentication_error", f"invalid x-api-key {key}")))
    rec = run_scenario(tmp_path, ROUTE, {**env, "ANTHROPIC_API_KEY": key})
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert "invalid x-api-key [API key]" in rec.bodies[0]["error"]["message"]
    assert files_holding(tmp_path / "home", key) == []


@pytest.mark.parametrize(("url", "expected"), [
    ("127.0.0.1:9", "ANTHROPIC_BASE_URL: expected an http(s) URL"),
    ("https://api.anthropic.com.", "needs an API key: set ANTHROPIC_API_KEY"),
])
def test_base_url_checks(tmp_path, url, expected) -> None:
    rec = run_scenario(tmp_path, ROUTE, {"ANTHROPIC_API_KEY": "", "ANTHROPIC_BASE_URL": url})
    assert rec.exit_code == 2 and expected in rec.output, rec.output
    assert rec.run is None
