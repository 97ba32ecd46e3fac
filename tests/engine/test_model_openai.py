"""``openai:MODEL`` end to end: the real ``openai`` SDK against a Chat
Completions server on 127.0.0.1 speaking the streaming wire format
(``chat.completion.chunk`` objects as SSE ``data:`` lines, ``[DONE]`` last,
usage in a final chunk with no choices), through ``loopledger run``; each
case checks the candidates, attempts and reason the journal recorded."""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from loopledger.engine._errors import ModelError, ModelTimeout  # noqa: E402
from loopledger.engine._model import within  # noqa: E402
from loopledger.engine._openai import error_table, translate_error  # noqa: E402
from loopledger.engine._vendor import nearest_rule  # noqa: E402
from provider_kit import (  # noqa: E402
    SCENARIO, ProviderServer, Reply, files_holding, items, paced, run_scenario, sse)

ROUTE = "openai:test-model"


@pytest.fixture
def server():
    s = ProviderServer()
    yield s
    s.close()


@pytest.fixture
def env(server: ProviderServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": f"{server.url}/v1", "OPENAI_API_KEY": "test-key", "LOOPLEDGER_PRICES": ""}


# -- the wire format ------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "test-model",
                "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]})


def usage_chunk(prompt: int = 40, completion: int = 9, cached: int = 0) -> bytes:
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "test-model",
                "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                         "total_tokens": prompt + completion,
                                         "prompt_tokens_details": {"cached_tokens": cached}}})


def call_pieces(index: int, call_id: str, name: str, arguments: str, size: int = 3) -> list[bytes]:
    first = chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                   "function": {"name": name, "arguments": ""}}]})
    rest = [chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + size]}}]})
            for i in range(0, len(arguments), size)]
    return [first, *rest]


def stream(*frames: bytes, finish: str | None, usage: bool = True, done: bool = True) -> Reply:
    tail = [chunk({}, finish)] if finish else []
    return Reply(frames=[chunk({"role": "assistant", "content": ""}), *frames, *tail,
                         *([usage_chunk()] if usage else []), *([sse("[DONE]")] if done else [])])


def text(words: str, finish: str = "stop") -> Reply:
    return stream(*(chunk({"content": w + " "}) for w in words.split()), finish=finish)


def lookup(order: str = "ORD-1042", call_id: str = "call_a") -> Reply:
    return stream(*call_pieces(0, call_id, "orders__get_order", json.dumps({"order_id": order})),
                  finish="tool_calls")


def error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# -- cases ----------------------------------------------------------------------------


def test_plain_text_is_a_trusted_stop_with_usage_and_cost(tmp_path: Path, server, env) -> None:
    server.script(text("ORD-1042 is paid."))
    scenario = {**SCENARIO, "contract": {"goal": "Say hello.", "allowed_tools": ["orders.get_order"]}}
    rec = run_scenario(tmp_path, "openai:gpt-4.1-mini", env, scenario)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    [cand] = rec.candidates
    assert cand["finish_reason"] == "stop"
    assert items(cand["items_json"]) == [{"type": "text", "text": "ORD-1042 is paid. "}]
    assert (cand["tokens_in"], cand["tokens_out"]) == (40, 9)
    assert cand["cost_usd"] == pytest.approx((40 * 0.40 + 9 * 1.60) / 1e6)  # docs/models.md
    body = rec.bodies[0]
    assert body["prompt_version"] == "v1" and len(body["prompt_hash"]) == 64
    sent = server.requests[0]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"][0]["role"] == "system" and sent["messages"][1]["content"] == (
        "Say hello.\nIn the final answer, state each claim on its own line as: "
        "Claim: WHAT (evidence: KIND:SUBJECT, ...).")
    assert [t["function"]["name"] for t in sent["tools"]] == ["orders__get_order"]


def test_claims_stated_in_the_answer_are_claim_items_the_validators_check(tmp_path, server, env) -> None:
    """The task asks for one claim per line, ``Claim: WHAT (evidence: ...)``;
    a final answer's such lines become claim items, so a claim citing
    evidence the run never recorded is refused (``references``), and one
    citing what the lookup found is accepted."""
    unfounded = "Refunded.\nClaim: ORD-1042 was refunded (evidence: refund_confirmed:ORD-1042)"
    founded = "ORD-1042 is paid.\n- **Claim:** ORD-1042 is paid (evidence: `order_found:ORD-1042`)\n"
    server.script(lookup(), stream(chunk({"content": unfounded}), finish="stop"),
                  stream(chunk({"content": founded[:20]}), chunk({"content": founded[20:]}), finish="stop"))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    first, second = (items(c["items_json"]) for c in rec.candidates[1:])
    assert first == [{"type": "text", "text": unfounded},
                     {"type": "claim", "text": "ORD-1042 was refunded", "evidence": ["refund_confirmed:ORD-1042"]}]
    assert second[1:] == [{"type": "claim", "text": "ORD-1042 is paid", "evidence": ["order_found:ORD-1042"]}]
    task = server.requests[0]["messages"][1]["content"]
    assert "state each claim on its own line as: Claim: WHAT (evidence: KIND:SUBJECT, ...)" in task
    # The model is told why its first answer was refused, and sees that answer once, its claim not doubled.
    retry = server.requests[2]["messages"]
    said = [m["content"] for m in retry if m["role"] == "assistant" and m.get("content")]
    assert said == [unfounded]
    assert any("refund_confirmed:ORD-1042" in json.dumps(m) and m["role"] != "assistant" for m in retry)


def test_tool_call_split_across_many_chunks_runs_and_its_result_goes_back_by_call_id(tmp_path, server, env):
    server.script(lookup(), text("ORD-1042 is paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    first = items(rec.candidates[0]["items_json"])
    assert first == [{"type": "tool_call", "call_id": "call_a", "name": "orders.get_order", "version": None,
                      "arguments": {"order_id": "ORD-1042"}}]
    assert rec.candidates[0]["finish_reason"] == "tool_calls"
    # The scenario's scripted entries (ORD-1001) were not played.
    assert [json.loads(o["canonical_args_json"]) if isinstance(o["canonical_args_json"], str)
            else o["canonical_args_json"] for o in rec.operations] == [{"order_id": "ORD-1042"}]
    second = server.requests[1]["messages"]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["id"] == "call_a"
    assert assistant["tool_calls"][0]["function"]["name"] == "orders__get_order"
    tool = next(m for m in second if m["role"] == "tool")
    assert tool["tool_call_id"] == "call_a" and "order" in json.loads(tool["content"])["tool"]
    assert second[0]["role"] == "system" and len(server.requests) == 2


def test_parallel_tool_calls_interleaved_are_assembled_by_index(tmp_path, server, env) -> None:
    a = call_pieces(0, "call_a", "orders__get_order", json.dumps({"order_id": "ORD-1042"}))
    b = call_pieces(1, "call_b", "orders__get_order", json.dumps({"order_id": "ORD-1043"}))
    interleaved = [frame for pair in zip(a, b) for frame in pair] + a[len(b):] + b[len(a):]
    server.script(stream(*interleaved, finish="tool_calls"), text("Both are paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    calls = items(rec.candidates[0]["items_json"])
    assert [(c["call_id"], c["arguments"]) for c in calls] == [
        ("call_a", {"order_id": "ORD-1042"}), ("call_b", {"order_id": "ORD-1043"})]
    assert len(rec.operations) == 2
    tools = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_a", "call_b"]


@pytest.mark.parametrize("arguments", ['{"order_id": "ORD-1042", "n": NaN}', '{"order_id": "ORD-1042", "n": 1e400}',
                                       '{"order_id": ' + "[" * 20000 + "]" * 20000 + "}"])
def test_arguments_a_journal_cannot_keep_are_raw_arguments_and_repaired(tmp_path, server, env, arguments) -> None:
    """JSON that Python reads but a journal cannot keep (NaN, a number past
    a double, nesting too deep to walk) is no parsed call: it is kept as
    ``raw_arguments`` and repaired, as any unparseable arguments are; the
    run is not stopped in MODEL_RUNNING by it."""
    server.script(stream(*call_pieces(0, "call_a", "orders__get_order", arguments, size=4000), finish="tool_calls"),
                  lookup(), text("ORD-1042 is paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    [bad] = items(rec.candidates[0]["items_json"])
    assert "arguments" not in bad and bad["raw_arguments"] == arguments
    assert rec.candidates[0]["tokens_out"] == 9  # its usage is counted


def test_an_older_servers_function_call_deltas_are_the_call(tmp_path, server, env) -> None:
    arguments = json.dumps({"order_id": "ORD-1042"})
    legacy = [chunk({"function_call": {"name": "orders__get_order", "arguments": ""}}),
              *(chunk({"function_call": {"arguments": arguments[i:i + 5]}}) for i in range(0, len(arguments), 5))]
    server.script(stream(*legacy, finish="function_call"), text("ORD-1042 is paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    [call] = items(rec.candidates[0]["items_json"])
    assert (call["name"], call["arguments"]) == ("orders.get_order", {"order_id": "ORD-1042"})
    assert rec.candidates[0]["finish_reason"] == "tool_calls" and len(rec.operations) == 1


def test_stream_cut_mid_arguments_is_an_incomplete_attempt_then_a_new_one(tmp_path, server, env) -> None:
    pieces = call_pieces(0, "call_a", "orders__get_order", json.dumps({"order_id": "ORD-1042"}))
    server.script(Reply(frames=[chunk({"role": "assistant"}), *pieces[:3]], cut=True), lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    broken = rec.candidates[0]
    assert (broken["step"], broken["attempt"], broken["finish_reason"]) == (1, 1, "incomplete")
    [partial] = items(broken["items_json"])
    assert "arguments" not in partial and partial["raw_arguments"] == '{"orde'
    assert (rec.candidates[1]["step"], rec.candidates[1]["attempt"]) == (1, 2)
    assert ("MODEL_RUNNING", "MODEL_RUNNING", 1, 2) in rec.transitions()
    # The half-received call never reached a tool: its one result says so.
    assert sorted((op["outcome"], op["dispatch_count"]) for op in rec.operations) == [("cancelled", 0), ("success", 1)]
    # The retry is sent the same context: nothing of the broken attempt.
    assert server.requests[1]["messages"] == server.requests[0]["messages"]


def test_error_object_inside_the_stream_fails_the_attempt_and_the_engine_retries(tmp_path, server, env):
    broken = Reply(frames=[chunk({"content": "Look"}), sse(error_body("The server had an error", "server_error"))])
    server.script(broken, lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.candidates[0]["finish_reason"] == "error"
    assert rec.bodies[0]["error"]["code"] == "server_error" and rec.bodies[0]["error"]["retryable"] is True


def test_429_with_retry_after_backs_off_then_retries(tmp_path, server, env) -> None:
    limited = Reply(429, body=error_body("Rate limit reached", "requests"), headers={"retry-after-ms": "120"})
    server.script(limited, lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.candidates[0]["finish_reason"] == "error" and rec.bodies[0]["error"]["code"] == "rate_limited"
    retry = next(e for e in rec.events if e.kind == "transition" and e.payload.get("retry_of"))
    assert retry.payload["backoff_s"] == pytest.approx(0.12)
    assert len(server.requests) == 3  # one request per attempt: the SDK did not retry on its own


def test_429_asking_to_wait_past_the_deadline_ends_the_run_at_once(tmp_path, server, env) -> None:
    server.script(Reply(429, body=error_body("Rate limit reached", "tokens"), headers={"retry-after": "300"}))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("BUDGET_EXHAUSTED", "deadline"), rec.output
    assert len(rec.candidates) == 1 and len(server.requests) == 1


def test_500_on_every_attempt_fails_the_run_after_the_engines_attempts(tmp_path, server, env) -> None:
    server.script(*[Reply(500, body=error_body("boom", "server_error"))] * 3)
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert [(c["attempt"], c["finish_reason"]) for c in rec.candidates] == [(1, "error"), (2, "error"), (3, "error")]
    assert len(server.requests) == 3
    # Why, where a reader looks: each retry's event and the run's last detail.
    retries = [e.payload for e in rec.events if e.kind == "transition" and "retry_of" in e.payload]
    assert [r["error"]["code"] for r in retries] == ["server_error"] * 2 and "boom" in retries[0]["error"]["message"]
    # A struggling server is not hammered: each retry waited a little longer.
    assert [r["backoff_s"] for r in retries] == [0.5, 1.0]
    (final,) = [e.payload for e in rec.events if e.kind == "transition" and e.to_state == "FINALIZING"]
    assert final["detail"].startswith("3 attempts ended 'error'; the last: server_error: ") and "boom" in final["detail"]


def test_bad_credentials_fail_the_run_without_a_retry(tmp_path, server, env) -> None:
    server.script(Reply(401, body=error_body("Incorrect API key provided", "invalid_request_error")))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert len(rec.candidates) == 1 and rec.bodies[0]["error"] == {
        "code": "auth", "message": rec.bodies[0]["error"]["message"], "retryable": False}
    finalizing = next(e for e in rec.events if e.to_state == "FINALIZING")
    assert finalizing.payload["detail"].startswith("auth: AuthenticationError")


@pytest.mark.parametrize("reply", [
    pytest.param(stream(*call_pieces(0, "call_a", "orders__get_order", '{"order_id": "ORD-1042"}'), finish="stop"),
                 id="stop-with-tool-calls"),
    pytest.param(stream(chunk({"content": "done"}), finish="tool_calls"), id="tool-calls-without-any"),
])
def test_stop_signal_contradicting_the_content_is_a_protocol_error(tmp_path, server, env, reply) -> None:
    server.script(reply)
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "protocol_error"), rec.output
    # Nothing was sent; each call proposed has its one result all the same.
    proposed = [i["call_id"] for c in rec.candidates for i in items(c["items_json"]) if i["type"] == "tool_call"]
    assert [(op["call_id"], op["outcome"], op["dispatch_count"]) for op in rec.operations] == [
        (call_id, "cancelled", 0) for call_id in proposed]


def test_refusal_is_a_content_filter_finish(tmp_path, server, env) -> None:
    server.script(stream(chunk({"refusal": "I can't help with that."}), finish="stop"))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("POLICY_STOPPED", "policy"), rec.output
    assert rec.candidates[0]["finish_reason"] == "content_filter"


def test_stream_without_a_finish_reason_is_incomplete(tmp_path, server, env) -> None:
    server.script(stream(chunk({"content": "half"}), finish=None), lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert rec.candidates[0]["finish_reason"] == "incomplete"
    assert rec.run.state.value == "SUCCEEDED"


def test_a_server_that_does_not_stream_is_named_as_such(tmp_path, server, env) -> None:
    """A compatible server that ignores ``stream: true`` answers with one
    JSON body: each attempt says so, and so does the run's end."""
    whole = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "test-model",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paid."}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
    server.script(*[Reply(200, body=whole)] * 3)
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    (final,) = [e.payload for e in rec.events if e.kind == "transition" and e.to_state == "FINALIZING"]
    assert "bad_response" in final["detail"] and "does it stream" in final["detail"], final


# -- errors -----------------------------------------------------------------------------


def _attribute(module: Any, name: str) -> Any:
    try:
        return getattr(module, name)
    except Exception:  # noqa: BLE001 - module-level client proxies build a client on access
        return None


def sdk_exceptions() -> list[type[BaseException]]:
    exported = [_attribute(openai, name) for name in dir(openai) if not name.startswith("_")]
    # type(obj), not inspect.isclass: the SDK's lazy module proxies build a client when asked their __class__.
    found = {obj for obj in exported if issubclass(type(obj), type) and issubclass(obj, BaseException)}
    found |= {obj for obj in vars(openai._exceptions).values()
              if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith("openai")}
    return sorted(found, key=lambda c: c.__name__)


def test_every_exception_the_sdk_exports_is_mapped() -> None:
    table = error_table()
    classes = sdk_exceptions()
    assert len(classes) > 10
    unmapped = [c.__name__ for c in classes if nearest_rule(c, table) is None]
    assert unmapped == []
    # Only the SDK's root may land on the catch-all: any other class reaching
    # it is an SDK addition nobody decided about.
    generic = [c.__name__ for c in classes if nearest_rule(c, table)[0] is openai.OpenAIError
               and c is not openai.OpenAIError]
    assert generic == [], "map these in engine/_openai.py ERROR_RULES"
    for cls in classes:
        error = translate_error(cls.__new__(cls))  # attributes may be missing: the mapping copes
        assert isinstance(error, ModelError) and isinstance(error.retryable, bool)
        assert error.__cause__ is None  # translate builds; the adapter raises or yields


def test_missing_key_and_missing_sdk_are_bad_input(tmp_path, monkeypatch) -> None:
    rec = run_scenario(tmp_path, ROUTE, {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    assert rec.exit_code == 2 and "OPENAI_API_KEY" in rec.output
    monkeypatch.setitem(__import__("sys").modules, "openai", None)
    rec = run_scenario(tmp_path, ROUTE, {"OPENAI_API_KEY": "k"})
    assert rec.exit_code == 2 and "pip install 'loopledger[openai]'" in rec.output


# -- slow streams, bad settings ---------------------------------------------------------

#: A scenario a plain text answer completes.
HELLO = {**SCENARIO, "contract": {"goal": "Say hello.", "allowed_tools": ["orders.get_order"]}}


def dots(count: int) -> Reply:
    return text(" ".join("." * count))


def test_a_slow_stream_is_cut_at_the_runs_deadline(tmp_path, server, env) -> None:
    server.script(paced(server, dots(16), 0.25))  # 4 s in all
    scenario = {**HELLO, "budgets": {**HELLO["budgets"], "deadline_s": 1.5}}
    rec = run_scenario(tmp_path, ROUTE, env, scenario)
    assert (rec.run.state.value, rec.run.reason) == ("BUDGET_EXHAUSTED", "deadline"), rec.output
    [cut] = rec.candidates
    assert cut["finish_reason"] == "incomplete" and items(cut["items_json"])[0]["text"].count(".") < 16
    assert rec.bodies[0]["error"]["code"] == "timeout" and rec.bodies[0]["error"]["retryable"] is True
    assert len(server.requests) == 1


def test_a_slow_stream_is_cut_at_the_model_timeout_and_retried(tmp_path, server, env) -> None:
    server.script(paced(server, dots(16), 0.25), text("Hello."))
    rec = run_scenario(tmp_path, ROUTE, {**env, "LOOPLEDGER_MODEL_TIMEOUT_S": "1"}, HELLO)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert [c["finish_reason"] for c in rec.candidates] == ["incomplete", "stop"]
    assert rec.bodies[0]["error"]["code"] == "timeout" and rec.bodies[0]["error"]["retryable"] is True
    assert items(rec.candidates[1]["items_json"]) == [{"type": "text", "text": "Hello. "}]
    assert len(server.requests) == 2


def test_a_call_past_its_time_is_given_up_and_its_stream_closed() -> None:
    closed = threading.Event()

    class Endless:  # an SDK stream that never ends
        def __iter__(self) -> Iterator[str]:
            while True:
                time.sleep(0.05)
                yield "."

        def close(self) -> None:
            closed.set()

    received: list[str] = []
    started = time.monotonic()
    with pytest.raises(ModelTimeout, match=r"within 0\.3s"):
        received.extend(within(0.3, Endless, provider="openai"))
    assert 0.3 <= time.monotonic() - started < 1 and received
    assert closed.wait(1)


def test_429_insufficient_quota_fails_the_run_without_a_retry(tmp_path, server, env) -> None:
    body = {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota",
                      "param": None, "code": "insufficient_quota"}}
    server.script(Reply(429, body=body), lookup(), text("Paid."))
    rec = run_scenario(tmp_path, ROUTE, env)
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert rec.bodies[0]["error"]["code"] == "quota_exhausted" and rec.bodies[0]["error"]["retryable"] is False
    assert len(server.requests) == 1
    assert not any(e.payload.get("backoff_s") for e in rec.events if e.kind == "transition")


def test_a_chunk_that_is_not_json_is_a_bad_response_and_retried(tmp_path, server, env) -> None:
    server.script(Reply(frames=[b"data: {not json\n\n"]), text("Hello."))
    rec = run_scenario(tmp_path, ROUTE, env, HELLO)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.candidates[0]["finish_reason"] == "error"
    assert rec.bodies[0]["error"]["code"] == "bad_response" and rec.bodies[0]["error"]["retryable"] is True
    assert len(server.requests) == 2


@pytest.mark.parametrize(("name", "raw"), [
    ("LOOPLEDGER_MODEL_TIMEOUT_S", "nan"),
    ("LOOPLEDGER_MODEL_TIMEOUT_S", "inf"),
    ("LOOPLEDGER_MODEL_TIMEOUT_S", "abc"),
    ("LOOPLEDGER_MODEL_TIMEOUT_S", "0"),
    ("LOOPLEDGER_MODEL_TIMEOUT_S", "-5"),
])
def test_a_setting_that_is_not_a_positive_number_is_bad_input(tmp_path, server, env, name, raw) -> None:
    rec = run_scenario(tmp_path, ROUTE, {**env, name: raw})
    assert rec.exit_code == 2 and f"{name}: expected a positive number, got {raw!r}" in rec.output
    assert rec.run is None and server.requests == []


@pytest.mark.parametrize("raw", ["inf", "nan", "1.5", "0", "-3", "99999999999999999999", "many"])
def test_max_output_tokens_is_a_whole_number_in_range(tmp_path, server, env, raw) -> None:
    rec = run_scenario(tmp_path, ROUTE, {**env, "LOOPLEDGER_MAX_OUTPUT_TOKENS": raw})
    assert rec.exit_code == 2, rec.output
    assert f"LOOPLEDGER_MAX_OUTPUT_TOKENS: expected a whole number of tokens from 1 to 10,000,000, got {raw!r}" \
        in rec.output
    assert rec.run is None and server.requests == []


@pytest.mark.parametrize(("route", "extra_env", "expected"), [
    ("openai: test-model", {}, "a model name has no spaces"),
    ("openai:test model", {}, "a model name has no spaces"),
    (ROUTE, {"OPENAI_API_KEY": "   "}, "OPENAI_API_KEY: is set but blank"),
])
def test_a_route_with_spaces_or_a_blank_key_is_bad_input(tmp_path, server, env, route, extra_env, expected) -> None:
    rec = run_scenario(tmp_path, route, {**env, **extra_env})
    assert rec.exit_code == 2 and expected in rec.output, rec.output
    assert rec.run is None and server.requests == []


@pytest.mark.parametrize(("content", "field", "expected"), [
    pytest.param(None, "", "No such file", id="missing"),
    pytest.param("not json", "", "expected a JSON object", id="not-json"),
    pytest.param("[1, 2]", "", "got list", id="list"),
    pytest.param('{"test-model": 3}', ": test-model", "got int", id="not-an-object"),
    pytest.param('{"test-model": {"input": "cheap", "output": 1}}', ": test-model.input", "got 'cheap'",
                 id="string"),
    pytest.param('{"test-model": {"input": -1, "output": 1}}', ": test-model.input", "got -1", id="negative"),
    pytest.param('{"test-model": {"input": NaN, "output": 1}}', ": test-model.input", "got nan", id="nan"),
    pytest.param('{"test-model": {"input": 1, "output": true}}', ": test-model.output", "got True", id="bool"),
    pytest.param('{"test-model": {"input": 1}}', ": test-model.output", "missing", id="no-output"),
    pytest.param('{"test-model": {"input": 1, "output": 2, "cached": 0.5}}', ": test-model.cached",
                 "unknown field", id="unknown-field"),
])
def test_a_bad_price_file_is_bad_input_before_any_call(tmp_path, server, env, content, field, expected) -> None:
    prices = tmp_path / "prices.json"
    if content is not None:
        prices.write_text(content)
    server.script(text("Hello."))
    rec = run_scenario(tmp_path, ROUTE, {**env, "LOOPLEDGER_PRICES": str(prices)}, HELLO)
    assert rec.exit_code == 2, rec.output
    [line] = rec.output.strip().splitlines()
    assert f"LOOPLEDGER_PRICES={prices}{field}: " in line and expected in line
    assert rec.run is None and server.requests == []


def test_a_price_file_adds_to_the_table(tmp_path, server, env) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text('{"test-model": {"input": 1, "output": 2, "cached_input": 0.5, "cache_write": null}}')
    server.script(text("Hello."))
    rec = run_scenario(tmp_path, ROUTE, {**env, "LOOPLEDGER_PRICES": str(prices)}, HELLO)
    assert (rec.run.state.value, rec.run.reason) == ("SUCCEEDED", "completed"), rec.output
    assert rec.candidates[0]["cost_usd"] == pytest.approx((40 * 1 + 9 * 2) / 1e6)


@pytest.mark.parametrize("url", ["not a url", "ftp://127.0.0.1:9/v1", "127.0.0.1:9", "http://", "http://h:port/v1"])
def test_a_base_url_the_sdk_cannot_reach_is_bad_input_before_anything_is_recorded(tmp_path, server, env, url) -> None:
    rec = run_scenario(tmp_path, ROUTE, {**env, "OPENAI_BASE_URL": url})
    assert rec.exit_code == 2, rec.output
    assert "OPENAI_BASE_URL: expected an http(s) URL" in rec.output and repr(url) in rec.output
    assert rec.run is None and server.requests == []


@pytest.mark.parametrize("url", ["https://api.openai.com./v1", "https://eu.api.openai.com/v1", "https://API.OpenAI.com"])
def test_any_host_of_the_providers_own_needs_its_key(tmp_path, url) -> None:
    rec = run_scenario(tmp_path, ROUTE, {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": url})
    assert rec.exit_code == 2 and "needs an API key: set OPENAI_API_KEY" in rec.output, rec.output
    assert rec.run is None


def test_a_key_the_server_echoes_in_its_error_is_never_recorded(tmp_path, server, env) -> None:
    key = "sk-test-ECHOED-0123456789"
    server.script(Reply(401, body=error_body(f"Incorrect API key provided: {key}", "invalid_request_error")))
    rec = run_scenario(tmp_path, ROUTE, {**env, "OPENAI_API_KEY": key})
    assert (rec.run.state.value, rec.run.reason) == ("FAILED", "model_error"), rec.output
    assert "Incorrect API key provided: [API key]" in rec.bodies[0]["error"]["message"]
    assert files_holding(tmp_path / "home", key) == []
    assert key not in rec.output


def test_no_retry_begins_after_a_pause_that_reaches_the_deadline(tmp_path, server, env) -> None:
    """A server error's pause (0.5 s, then 1 s) with under 1 s of the run
    left: the run ends at the deadline instead of sending a call that
    could not finish. (1.5 s: the first pause fits if the first answer came
    within a second; the second never does.)"""
    server.script(*[Reply(500, body=error_body("boom", "server_error"))] * 3)
    scenario = {**HELLO, "budgets": {**HELLO["budgets"], "deadline_s": 1.5}}
    rec = run_scenario(tmp_path, ROUTE, env, scenario)
    assert (rec.run.state.value, rec.run.reason) == ("BUDGET_EXHAUSTED", "deadline"), rec.output
    assert len(server.requests) == 2  # the first retry fitted; the second would begin past the deadline
    (final,) = [e.payload for e in rec.events if e.kind == "transition" and e.to_state == "FINALIZING"]
    assert final["detail"] == "a retry would begin after a 1.0s pause, past the run's deadline"
