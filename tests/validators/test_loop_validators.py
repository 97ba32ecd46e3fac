"""The loop detectors as suite members: decide on the candidate before it runs."""

from __future__ import annotations

from validators_helpers import call, make_input, text

from loopledger.validators import StepRecord, Verdict, call_key, get_factory

ORDER = {"order_id": "ORD-1042"}


def _history(inp_calls, n, **extra):
    return [StepRecord(run_id="run-1", step=i + 1, calls=inp_calls, **extra).to_dict() for i in range(n)]


def _key(args):
    inp = make_input([call("orders.get_order", args)])
    return call_key(inp.proposed_calls[0].tool, inp.proposed_calls[0].args_hash)


def test_repeated_call_rejects_the_third_identical_call_before_it_runs():
    rc = get_factory("loop.repeated_call")(threshold=3)
    key = _key(ORDER)
    inp = make_input([call("orders.get_order", ORDER)], facts={"history": _history((key,), 2, new_evidence=1)}, step=3)
    d = rc(inp)
    assert (d.verdict, d.code) == (Verdict.REJECT, "loop_detected")
    assert d.evidence["call"] == key and d.evidence["since_step"] == 3
    # different arguments, or a final answer, are not a repetition
    assert rc(make_input([call("orders.get_order", {"order_id": "ORD-1043"})], facts={"history": _history((key,), 2)})).code == "ok"
    assert rc(make_input([text("done")], facts={"history": _history((key,), 2)})).code == "ok"


def test_canonical_arguments_make_spelled_differently_calls_identical():
    rc = get_factory("loop.repeated_call")(threshold=2)
    first = make_input([call("workspace.read_file", {"path": "./a/../b.txt"})])
    key = call_key(first.proposed_calls[0].tool, first.proposed_calls[0].args_hash)
    d = rc(make_input([call("workspace.read_file", {"path": "b.txt"})], facts={"history": _history((key,), 1)}))
    assert d.code == "loop_detected"


def test_repeated_error_rejects_after_threshold_errors():
    re_ = get_factory("loop.repeated_error")(threshold=2)
    hist = [StepRecord("run-1", 1, errors=("RATE_LIMIT",)).to_dict(), StepRecord("run-1", 2, errors=("RATE_LIMIT",)).to_dict()]
    d = re_(make_input([call("orders.get_order", ORDER)], facts={"history": hist}))
    assert (d.code, d.evidence["code"]) == ("loop_detected", "RATE_LIMIT")
    assert re_(make_input([call("orders.get_order", ORDER)], facts={"history": hist[:1]})).code == "ok"


def test_no_progress_rejects_after_a_window_without_progress():
    np_ = get_factory("loop.no_progress")(window=3)
    hist = [StepRecord("run-1", i + 1).to_dict() for i in range(3)]
    d = np_(make_input([call("orders.get_order", ORDER)], facts={"history": hist}))
    assert (d.verdict, d.code) == (Verdict.REJECT, "no_progress")
    hist[-1]["new_evidence"] = 1
    assert np_(make_input([call("orders.get_order", ORDER)], facts={"history": hist})).code == "ok"


def test_oscillation_rejects_a_candidate_that_closes_the_cycle():
    osc = get_factory("loop.oscillation")(period=2, cycles=2)
    a, b = _key(ORDER), _key({"order_id": "ORD-1043"})
    hist = [StepRecord("run-1", i + 1, calls=(k,)).to_dict() for i, k in enumerate((a, b, a))]
    d = osc(make_input([call("orders.get_order", {"order_id": "ORD-1043"})], facts={"history": hist}))
    assert (d.code, d.evidence["pattern"]) == ("loop_detected", "oscillation_calls")
    assert osc(make_input([call("orders.get_order", {"order_id": "ORD-1044"})], facts={"history": hist})).code == "ok"


def test_remembered_history_prefix_gives_the_same_decisions_as_a_full_replay() -> None:
    """Loop validators remember detector states between a run's candidates;
    on long random histories every decision equals one made from scratch."""
    import random

    from loopledger.validators import Candidate, DecisionInput, RunFacts, StepRecord, load_suite
    from loopledger.validators import _loop_validators as loop_validators

    suite = load_suite("default")
    rng = random.Random(7)
    for trial in range(8):
        history: list[StepRecord] = []
        for step in range(1, 90):
            calls = (rng.choice(["a:1", "b:2", "c:3"]),) if rng.random() < 0.8 else ()
            errors = (rng.choice(["E1", "E2"]),) if rng.random() < 0.1 else ()
            history.append(StepRecord(run_id=f"run-{trial}", step=step, states=("READY", "MODEL_RUNNING"),
                                      calls=calls, errors=errors, new_evidence=int(rng.random() < 0.3)))
            inp = DecisionInput(run_id=f"run-{trial}", step=step + 1, attempt=1,
                                candidate=Candidate(items=[], finish_reason="stop"),
                                facts=RunFacts(history=tuple(history)))
            remembered = [d for d in suite.evaluate(inp).decisions if d.validator.startswith("loop.")]
            loop_validators._PREFIXES._entries.clear()
            fresh = [d for d in suite.evaluate(inp).decisions if d.validator.startswith("loop.")]
            assert remembered == fresh, (trial, step)
    # A different history under the same run id never borrows the remembered state.
    other = tuple(StepRecord(run_id="run-0", step=s, errors=("E9",)) for s in range(1, 60))
    inp = DecisionInput(run_id="run-0", step=60, attempt=1, candidate=Candidate(items=[], finish_reason="stop"),
                        facts=RunFacts(history=other))
    codes = {d.validator: d.code for d in suite.evaluate(inp).decisions}
    assert codes["loop.repeated_error"] == "loop_detected"
