"""Budgets at their edges: an allowance used exactly is not exceeded, and
the deadline holds while a run waits for background work."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from invariants import all_violations

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]

EXPORT_PAST_THE_DEADLINE = """\
id: deadline-while-waiting
contract:
  goal: Export the report
  required_evidence: [report_ready]
  allowed_tools: [reports.export]
budgets: {deadline_s: 1}
model:
  - tool_calls: [{name: reports.export, arguments: {query: monthly, delay_s: 60}}]
  - final: The report is exported.
    claims: [{text: exported, evidence: [report_ready]}]
  - final: The report is exported.
    claims: [{text: exported, evidence: [report_ready]}]
expect: {status: BUDGET_EXHAUSTED, reason: deadline}
"""


def run(path: Path, home: Path) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    start = time.monotonic()
    proc = subprocess.run([*CLI, "run", str(path), "--json", "--check", "--home", str(home)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    return line, time.monotonic() - start


def test_the_deadline_ends_a_run_waiting_for_background_work(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(EXPORT_PAST_THE_DEADLINE)
    line, seconds = run(path, tmp_path / "home")
    assert (line["status"], line["reason"]) == ("BUDGET_EXHAUSTED", "deadline")
    assert seconds < 30  # not the export's 60 s
    assert all_violations(tmp_path / "home") == []


def test_tool_calls_used_exactly_leave_the_final_answer_free(tmp_path: Path) -> None:
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "budget-tool-calls-used-exactly.yaml"
    line, _ = run(scenario, tmp_path / "home")
    assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")


def test_calls_past_the_tool_call_budget_each_get_their_one_terminal_result(tmp_path: Path) -> None:
    """The candidate was accepted, so its calls are tool requests: recorded,
    each ``cancelled`` (MAX_TOOL_CALLS), none sent, in the commit that ends
    the run."""
    scenario = Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "budget-max-tool-calls.yaml"
    home = tmp_path / "home"
    line, _ = run(scenario, home)
    assert (line["status"], line["reason"]) == ("BUDGET_EXHAUSTED", "max_tool_calls")
    journal = sqlite3.connect(home / "journal.sqlite")
    ops = journal.execute("SELECT tool, outcome, status, dispatch_count, canonical_args_json FROM operations "
                          "ORDER BY operation_id").fetchall()
    assert [(t, o, s, n) for t, o, s, n, _ in ops] == [("orders.get_order", "cancelled", "failed", 0)] * 3
    assert [json.loads(a)["order_id"] for *_, a in ops] == ["ORD-1013", "ORD-1014", "ORD-1015"]
    results = [json.loads(p) for (p,) in journal.execute(
        "SELECT payload_json FROM events WHERE kind = 'operation_result' ORDER BY seq")]
    assert [r["error_code"] for r in results] == ["MAX_TOOL_CALLS"] * 3
    assert journal.execute("SELECT tool_calls FROM runs").fetchone() == (0,)
    assert all_violations(home) == []


def test_the_deadline_counts_from_when_the_engine_takes_the_run_up(tmp_path: Path) -> None:
    """A run created with a batch and queued behind the others has not
    started: its outcome does not depend on what else is in the batch."""
    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner
    from loopledger.engine._scenario import load_scenario

    path = tmp_path / "quick.yaml"
    path.write_text("""\
id: quick-lookup
contract:
  goal: Look ORD-1001 up
  required_evidence: [order_found]
  allowed_tools: [orders.get_order]
budgets: {deadline_s: 0.5}
model:
  - tool_calls: [{name: orders.get_order, arguments: {order_id: ORD-1001}}]
  - final: ORD-1001 is paid.
    claims: [{text: paid, evidence: ["order_found:ORD-1001"]}]
expect: {status: SUCCEEDED, reason: completed}
""")
    scenario = load_scenario(path)
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        run_id = runner.create(scenario, "v1")
        time.sleep(0.7)  # queued for longer than its whole deadline
        runner.drive_all([run_id], 1)
        outcome = runner.outcome(run_id, scenario)
    finally:
        runner.close()
    assert (outcome.status, outcome.reason) == ("SUCCEEDED", "completed"), outcome
    assert all_violations(tmp_path / "home") == []


RETRIES_PAST_A_BUDGET = """\
id: retries-past-{budget}
contract:
  goal: Refund ORD-1040
  required_evidence: [refund_confirmed]
  allowed_tools: [payments.refund]
budgets: {{{budget}: {limit}}}
model:
  - {first}
  - {first}
  - tool_calls: [{{name: payments.refund, arguments: {{order_id: ORD-1040, amount: 25.0}}}}]
  - final: refunded
    claims: [{{text: refunded, evidence: [refund_confirmed]}}]
expect: {{status: BUDGET_EXHAUSTED, reason: {budget}, side_effects: {{payments.refund: 0}}}}
"""


@pytest.mark.parametrize(("budget", "limit", "first", "attempts"), [
    ("max_attempts", 1, "{error: overloaded}", 1),
    ("max_attempts", 2, "{stream: truncated, tool_calls: [{name: payments.refund, "
                        "arguments: {order_id: ORD-1040, amount: 25.0}}]}", 2),
    ("max_tokens", 1000, "{finish_reason: length, text: cut, usage: {tokens_in: 5000, tokens_out: 5000}}", 1),
    ("max_cost", 0.01, "{finish_reason: length, text: cut, usage: {tokens_in: 5, tokens_out: 5, cost_usd: 1.0}}", 1),
    # A broken attempt's stated usage counts too (it was spent).
    ("max_cost", 0.05, "{stream: truncated, tool_calls: [{name: payments.refund, arguments: {order_id: ORD-1040, "
                       "amount: 25.0}}], usage: {cost_usd: 0.08}}", 1),
    ("max_tokens", 1000, "{error: overloaded, usage: {tokens_in: 3000}}", 1),
])
def test_a_retry_in_a_step_is_a_model_call_no_budget_allows_past_its_end(
        tmp_path: Path, budget: str, limit: float, first: str, attempts: int) -> None:
    """Budgets were checked in READY only, so broken streams retried inside
    a step went past max_attempts, max_tokens and max_cost, and the refund
    proposed afterwards ran."""
    path = tmp_path / "s.yaml"
    path.write_text(RETRIES_PAST_A_BUDGET.format(budget=budget, limit=limit, first=first))
    line, _ = run(path, tmp_path / "home")  # --check: BUDGET_EXHAUSTED with this reason, no refund
    assert (line["status"], line["reason"]) == ("BUDGET_EXHAUSTED", budget)
    (made,) = sqlite3.connect(tmp_path / "home" / "journal.sqlite").execute(
        "SELECT model_attempts FROM runs").fetchone()
    assert made == attempts
    assert all_violations(tmp_path / "home") == []


RETRY_WITHIN_DEADLINE = """\
id: retry-within-deadline
contract: {goal: Say hello}
budgets: {deadline_s: 30}
model:
  - final: Hello.
"""


def test_a_retry_is_given_the_time_left_when_it_begins_not_when_its_step_began(tmp_path: Path) -> None:
    """A real model's call is bounded by what is left of the deadline. The
    context's budget is frozen when the step begins; the request of a retry
    in that step says how much is left now."""
    import dataclasses

    from loopledger.engine._home import Home
    from loopledger.engine._model import Finish, StreamError, TextDelta
    from loopledger.engine._runner import Runner
    from loopledger.engine._scenario import load_scenario
    from loopledger.engine._vendor import call_timeout

    seen: list[tuple[float | None, float, float]] = []

    class SlowThenFine:
        def stream(self, request):  # noqa: ANN001, ANN202 - a model adapter
            seen.append((request.time_left_s, request.context["budget"]["deadline_s"], call_timeout(request, 120)))
            if len(seen) == 1:
                time.sleep(0.4)
                yield StreamError("the server broke off", "server_error", True, 0.0)
                return
            yield TextDelta("Hello.")
            yield Finish("stop")

    path = tmp_path / "s.yaml"
    path.write_text(RETRY_WITHIN_DEADLINE)
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        config_for = runner.controller.config_for
        runner.controller.config_for = lambda record: dataclasses.replace(config_for(record), model=SlowThenFine())
        run_id = runner.create(load_scenario(path), "v1")
        runner.drive_all([run_id])
        assert runner.outcome(run_id).status == "SUCCEEDED"
    finally:
        runner.close()
    (first_left, first_budget, first_timeout), (second_left, second_budget, second_timeout) = seen
    assert first_budget == second_budget, "one context for the step's attempts"
    assert first_left <= 30 and second_left <= first_left - 0.4
    assert (first_timeout, second_timeout) == (first_left, second_left)


def test_a_budget_the_last_allowed_attempt_used_up_is_the_reason(tmp_path: Path) -> None:
    """Three broken attempts are both the step's last and the run's
    max_attempts: the user's budget is the reason, not model_error."""
    path = tmp_path / "s.yaml"
    path.write_text("id: attempts-at-the-cap\ncontract: {goal: Say hi}\nbudgets: {max_attempts: 3}\nmodel:\n"
                    + "  - {stream: truncated, text: hel}\n" * 3
                    + "  - final: hi\nexpect: {status: BUDGET_EXHAUSTED, reason: max_attempts}\n")
    line, _ = run(path, tmp_path / "home")  # --check
    assert (line["status"], line["reason"]) == ("BUDGET_EXHAUSTED", "max_attempts")
    assert all_violations(tmp_path / "home") == []
