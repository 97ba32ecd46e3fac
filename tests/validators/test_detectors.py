"""Loop detectors: streaming findings per detector, and streaming == batch."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopledger.validators import (
    DETECTORS,
    InputError,
    ParamError,
    StepRecord,
    detect_batch,
    detect_stream,
    make_detector,
    steps_frame,
)

A, B, C = "orders.get_order:aa", "payments.refund:bb", "workspace.list:cc"
ALL = [
    ("loop.repeated_call", {"threshold": 3}),
    ("loop.repeated_error", {"threshold": 3}),
    ("loop.no_progress", {"window": 3}),
    ("loop.oscillation", {"period": 2, "cycles": 2}),
]


def steps(*specs, run="r1"):
    return [StepRecord(run_id=run, step=i + 1, **spec) for i, spec in enumerate(specs)]


def feed(name, params, records):
    det = make_detector(name, params)
    return [f for r in records for f in det.observe(r)], det


def test_repeated_call_fires_once_at_the_threshold():
    found, det = feed("loop.repeated_call", {"threshold": 3}, steps(*[{"calls": (A,)}] * 5))
    assert [(f.step, f.pattern) for f in found] == [(3, "repeated_call")]
    assert found[0].evidence == {"call": A, "count": 3, "first_step": 1}
    assert det.active


def test_repeated_call_needs_consecutive_identical_calls():
    found, det = feed("loop.repeated_call", {"threshold": 3},
                      steps({"calls": (A,)}, {"calls": (A,)}, {"calls": ()}, {"calls": (A,)}, {"calls": (A, B)}))
    assert found == [] and not det.active


def test_repeated_error_counts_one_code():
    found, _ = feed("loop.repeated_error", {"threshold": 3},
                    steps({"errors": ("RATE_LIMIT",)}, {"errors": ()}, {"errors": ("RATE_LIMIT", "STATE_CONFLICT")},
                          {"errors": ("RATE_LIMIT",)}))
    assert [(f.step, f.evidence["code"], f.evidence["first_step"]) for f in found] == [(4, "RATE_LIMIT", 1)]


def test_repeated_error_accepts_different_codes():
    found, det = feed("loop.repeated_error", {"threshold": 3},
                      steps({"errors": ("A",)}, {"errors": ("B",)}, {"errors": ("C",)}))
    assert found == [] and not det.active


def test_no_progress_window_and_progress_markers():
    found, det = feed("loop.no_progress", {"window": 3}, steps({}, {}, {}, {}))
    assert [(f.step, f.evidence) for f in found] == [(3, {"window": 3, "first_step": 1})] and det.active
    # evidence, a completed operation, or a smaller candidate set each reset the window
    found, det = feed("loop.no_progress", {"window": 3},
                      steps({"candidates": 9}, {}, {"new_evidence": 1}, {}, {"completed_operations": 1}, {},
                            {"candidates": 4}, {}, {"candidates": 4}))
    assert found == [] and not det.active


def test_an_open_step_counts_for_the_call_patterns_only():
    # The last record of each run is the step of a candidate being decided:
    # its proposed calls, nothing ran.
    records = (steps({"calls": (A,)}, {"calls": (A,)}, {"calls": (A,), "open": True})
               + steps({}, {}, {"calls": (B,), "open": True}, run="r2")
               + steps(*[{"calls": (x,), "new_evidence": 1} for x in (A, B, A)], {"calls": (B,), "open": True},
                       run="r3"))
    params = [("loop.repeated_call", {"threshold": 3}), ("loop.no_progress", {"window": 3}),
              ("loop.oscillation", {"period": 2, "cycles": 2})]
    streamed = sorted((f.run_id, f.step, f.pattern) for f in detect_stream(records, params))
    assert streamed == [("r1", 3, "repeated_call"), ("r3", 4, "oscillation_calls")]
    batch = detect_batch(steps_frame(records), params)
    assert sorted(batch.select("run_id", "step", "pattern").rows()) == streamed
    # Between finished steps, an open one neither counts nor breaks a streak.
    records = steps({}, {"open": True}, {}, {"open": True, "calls": (A,)}, {})
    found = detect_batch(steps_frame(records), [("loop.no_progress", {"window": 3})])
    assert found.select("step", "evidence_json").rows() == [(5, '{"first_step":1,"window":3}')]
    assert [(f.step, f.evidence) for f in feed("loop.no_progress", {"window": 3}, records)[0]] == [
        (5, {"first_step": 1, "window": 3})]
    # A table without the open column has none: every step counts.
    plain = detect_batch(steps_frame(records).drop("open"), [("loop.no_progress", {"window": 3})])
    assert plain["step"].to_list() == [3]


def test_an_open_step_has_calls_only():
    with pytest.raises(ValueError, match="run r1 step 2: an open step has calls only"):
        StepRecord("r1", 2, calls=(A,), errors=("E",), open=True)
    frame = steps_frame(steps({}, {"open": True})).with_columns(new_evidence=pl.Series([0, 1]))
    with pytest.raises(InputError) as caught:
        detect_batch(frame, ALL)
    assert caught.value.where == "steps[1]" and "run r1 step 2" in str(caught.value)


def test_no_progress_is_not_fooled_by_a_larger_candidate_set():
    found, _ = feed("loop.no_progress", {"window": 2}, steps({"candidates": 3}, {"candidates": 5}))
    assert [f.step for f in found] == [2]


def test_oscillation_between_two_calls():
    found, det = feed("loop.oscillation", {"period": 2, "cycles": 2, "channels": ["calls"]},
                      steps({"calls": (A,)}, {"calls": (B,)}, {"calls": (A,)}, {"calls": (B,)}, {"calls": (A,)}))
    assert [(f.step, f.pattern, f.evidence["cycle"]) for f in found] == [(4, "oscillation_calls", [A, B])]
    assert det.active


def test_oscillation_of_states_and_constant_sequences_are_not_oscillation():
    repair = ("READY", "MODEL_RUNNING", "VALIDATING")
    run = ("READY", "MODEL_RUNNING", "VALIDATING", "TOOL_RUNNING")
    found, _ = feed("loop.oscillation", {"period": 2, "cycles": 2}, steps(*[{"states": s} for s in (repair, run, repair, run)]))
    assert [f.pattern for f in found] == ["oscillation_states"]
    found, det = feed("loop.oscillation", {"period": 2, "cycles": 2},
                      steps(*[{"calls": (A,), "states": run}] * 6))
    assert found == [] and not det.active
    found, _ = feed("loop.oscillation", {"period": 2, "cycles": 3}, steps(*[{"calls": (x,)} for x in (A, B, C, A, B, C)]))
    assert found == []


def test_a_steady_rhythm_of_steps_that_add_evidence_is_not_an_oscillation():
    # Read a config, then deploy with an approval, three times over: the
    # states alternate, but every step adds evidence and every call differs.
    read = ("READY", "MODEL_RUNNING", "VALIDATING", "TOOL_RUNNING")
    deploy = ("READY", "MODEL_RUNNING", "VALIDATING", "WAITING_USER", "TOOL_RUNNING")
    working = steps(*[{"states": s, "calls": (f"t:{i}",), "new_evidence": 1}
                      for i, s in enumerate((read, deploy) * 3)])
    stalled = steps(*[{"states": s, "calls": (f"t:{i}",)} for i, s in enumerate((read, deploy) * 3)])
    params = {"period": 2, "cycles": 3}
    for fn in (lambda recs: detect_stream(recs, [("loop.oscillation", params)]),
               lambda recs: detect_batch(steps_frame(recs), [("loop.oscillation", params)]).rows()):
        assert list(fn(working)) == []
        assert [f[4] if isinstance(f, tuple) else f.pattern for f in fn(stalled)] == ["oscillation_states"]
    # One step of evidence inside the cycle starts the count again.
    broken = steps(*[{"states": s, "new_evidence": int(i == 3)} for i, s in enumerate((read, deploy) * 4)])
    assert [f.step for f in detect_stream(broken, [("loop.oscillation", params)])] == [8]
    assert [row[1] for row in detect_batch(steps_frame(broken), [("loop.oscillation", params)]).rows()] == [8]
    # Calls that repeat are a loop whatever comes back.
    calls = steps(*[{"calls": (x,), "new_evidence": 1} for x in (A, B, A, B)])
    assert [f.pattern for f in detect_stream(calls, [("loop.oscillation", {"period": 2, "cycles": 2})])] == [
        "oscillation_calls"]


def test_findings_are_loop_diagnoses_rows():
    (f,) = detect_stream(steps(*[{"calls": (A,)}] * 3), [("loop.repeated_call", {"threshold": 3})])
    assert f.row() == {"run_id": "r1", "step": 3, "detector": "loop.repeated_call", "detector_version": "1",
                       "pattern": "repeated_call", "evidence_json": f'{{"call":"{A}","count":3,"first_step":1}}'}


@pytest.mark.parametrize(("name", "params"), [
    ("loop.repeated_call", {"threshold": 1}), ("loop.no_progress", {"window": 0}),
    ("loop.oscillation", {"period": 1}), ("loop.oscillation", {"channels": ["plans"]}), ("loop.nope", {}),
])
def test_bad_detector_params(name, params):
    with pytest.raises(ParamError):
        make_detector(name, params)


def test_batch_takes_rows_in_any_order_and_an_empty_table():
    records = steps(*[{"calls": (A,)}] * 3) + steps(*[{"errors": ("X",)}] * 3, run="r0")
    frame = steps_frame(records).sample(fraction=1.0, shuffle=True, seed=7)
    out = detect_batch(frame, ALL[:2])
    assert out.columns == ["run_id", "step", "detector", "detector_version", "pattern", "evidence_json"]
    assert out.select("run_id", "step", "pattern").rows() == [("r0", 3, "repeated_error"), ("r1", 3, "repeated_call")]
    assert detect_batch(steps_frame([]), ALL).height == 0


@pytest.mark.parametrize(("steps_arg", "detectors", "where"), [
    (None, [], "steps"),
    ({"run_id": []}, ALL, "steps"),
    ("frame", None, "detectors"),
    ("frame", "loop.repeated_call", "detectors"),
    ("frame", [("loop.repeated_call",)], "detectors[0]"),
    ("frame", [ALL[0], ("loop.no_progress", 5)], "detectors[1]"),
    ("frame", [(None, {})], "detectors[0]"),
])
def test_batch_arguments_of_the_wrong_shape_are_input_errors(steps_arg, detectors, where):
    from loopledger.validators import InputError

    frame = steps_frame(steps({"calls": (A,)})) if steps_arg == "frame" else steps_arg
    with pytest.raises(InputError) as caught:
        detect_batch(frame, detectors)
    assert caught.value.where == where, str(caught.value)


# --- streaming == batch -----------------------------------------------------

# Mostly a few tokens, so that patterns form; sometimes any text, so that
# the batch form's evidence JSON meets every escape the canonical form makes.
_tokens = st.sampled_from(["t.a:1", "t.b:2", "t.c:3"]) | st.text(max_size=4)
_record = st.fixed_dictionaries({
    "states": st.sampled_from([(), ("READY", "MODEL_RUNNING"), ("READY", "MODEL_RUNNING", "VALIDATING", "TOOL_RUNNING")]),
    "calls": st.lists(_tokens, max_size=2).map(tuple),
    "errors": st.lists(st.sampled_from(["RATE_LIMIT", "STATE_CONFLICT", "TIMEOUT"]), max_size=2).map(tuple),
    "new_evidence": st.sampled_from([0, 0, 0, 1]),
    "completed_operations": st.sampled_from([0, 0, 0, 1]),
    "candidates": st.none() | st.integers(0, 4),
})
# A step being decided (open) has calls only.
_open = st.fixed_dictionaries({"calls": st.lists(_tokens, max_size=2).map(tuple), "open": st.just(True)})
_runs = st.lists(st.lists(_record | _open, min_size=1, max_size=14), min_size=1, max_size=4)
_params = {
    "loop.repeated_call": st.fixed_dictionaries({"threshold": st.integers(2, 4)}),
    "loop.repeated_error": st.fixed_dictionaries({"threshold": st.integers(2, 4)}),
    "loop.no_progress": st.fixed_dictionaries({"window": st.integers(1, 4)}),
    "loop.oscillation": st.fixed_dictionaries({
        "period": st.integers(2, 3), "cycles": st.integers(2, 3),
        "channels": st.sampled_from([["calls"], ["states"], ["calls", "states"]])}),
}


@pytest.mark.parametrize("name", sorted(DETECTORS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), runs=_runs, interleave=st.randoms(use_true_random=False))
def test_streaming_equals_batch(name, data, runs, interleave):
    params = data.draw(_params[name])
    per_run = [[StepRecord(run_id=f"run-{r}", step=i + 1, **spec) for i, spec in enumerate(recs)]
               for r, recs in enumerate(runs)]
    # Interleave runs as a live engine would, keeping each run's step order.
    queues = [list(q) for q in per_run]
    fed = []
    while any(queues):
        q = interleave.choice([q for q in queues if q])
        fed.append(q.pop(0))
    streamed = sorted(f.key() for f in detect_stream(fed, [(name, params)]))
    batch = detect_batch(steps_frame(fed), [(name, params)])
    assert sorted(batch.rows()) == streamed


def test_batch_evidence_is_the_canonical_json_of_the_streaming_evidence_for_any_text():
    # Every character below U+0800 (controls, quotes, backslash, DEL, the
    # Latin and Greek ranges) and the awkward ones above it, in calls,
    # errors and states: the batch form writes its JSON in polars.
    odd = [chr(c) for c in range(0x800)] + ["\u2028", "\u2029", "\ufeff", "\uffff", "\U0001F600", "\U0010FFFF"]
    records = []
    for i, ch in enumerate(odd):
        token = f"t{ch}:{ch}|"
        records += steps(*[{"calls": (token,), "errors": (ch,), "states": (ch, "B") if k % 2 else ("A", ch)}
                           for k in range(4)], run=f"r{i:05d}")
    streamed = sorted(f.key() for f in detect_stream(records, ALL + [("loop.oscillation", {"channels": ["states"]})]))
    batch = detect_batch(steps_frame(records), ALL + [("loop.oscillation", {"channels": ["states"]})])
    assert len(streamed) >= 3 * len(odd)
    assert batch.rows() == streamed


def test_property_generator_produces_findings_for_every_detector():
    # Guard against an equivalence test that only ever compares empty lists.
    records = (steps(*[{"calls": (A,), "errors": ("E",)}] * 4)
               + steps(*[{"calls": (x,)} for x in (A, B, A, B)], run="r2"))
    frame = detect_batch(steps_frame(records), ALL)
    assert set(frame["detector"]) == set(DETECTORS)
    assert isinstance(frame, pl.DataFrame)



@pytest.mark.parametrize(("name", "params"), ALL, ids=[name for name, _ in ALL])
def test_a_copy_goes_on_independently_of_its_original(name, params) -> None:
    """What the loop validators rely on when they feed a copy of a run's remembered state."""
    records = [StepRecord(run_id="r", step=i, calls=("t:x",) if 7 <= i <= 10 else (f"t:{i}",),
                          errors=("E",) if i in (3, 7, 9) else (),
                          states=("READY", "A" if i % 2 else "B") if i >= 7 else ("READY", "C"),
                          new_evidence=1 if i == 6 else 0, completed_operations=0) for i in range(1, 15)]
    fresh = make_detector(name, params)
    expected = [f for rec in records for f in fresh.observe(rec) if f.step > 6]
    assert expected, "the records make the detector report after step 6"
    original = make_detector(name, params)
    for rec in records[:6]:
        original.observe(rec)
    twin = original.copy()
    assert type(twin) is type(original)
    first = [f for rec in records[6:] for f in twin.observe(rec)]
    second = [f for rec in records[6:] for f in original.observe(rec)]
    assert first == second == expected
