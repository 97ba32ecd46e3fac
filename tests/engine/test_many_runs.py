"""1,000 scripted runs driven 64 at a time in one process: every run ends as
its scenario expects, and the CONTRACT's hard rules hold on all of them."""

from __future__ import annotations

from pathlib import Path

from invariants import all_violations
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
# Side effects, a timeout reconciled, background work, a loop stop, a
# budget stop and a plain success, mixed so runs interleave every path.
MIX = [
    "happy-refund",
    "fault-timeout-after-commit",
    "background-final-while-running",
    "loop-repeated-call",
    "budget-max-tool-calls",
    "happy-two-reads-one-candidate",
    "fault-rate-limit",
    "model-truncated-then-ok",
]


def test_a_thousand_runs_at_concurrency_64(tmp_path: Path) -> None:
    scenarios = [load_scenario(ROOT / "datasets" / "scenarios" / f"{name}.yaml") for name in MIX]
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        created = [(runner.create(scenarios[i % len(scenarios)], "v1"), scenarios[i % len(scenarios)])
                   for i in range(1000)]
        runner.drive_all([run_id for run_id, _ in created], concurrency=64)
        outcomes = [runner.outcome(run_id, scenario) for run_id, scenario in created]
    finally:
        runner.close()
    assert len(outcomes) == 1000
    assert [(o.run_id, o.mismatches) for o in outcomes if not o.ok] == []
    assert all_violations(tmp_path / "home") == []


def test_a_run_stopped_by_an_unexpected_error_does_not_stop_the_others(tmp_path: Path, monkeypatch) -> None:
    """The others are driven to their end; the failure is reported once, by
    run, and the stopped run stays at its last committed state."""
    import pytest

    from loopledger.engine import RunsStopped, State

    scenario = load_scenario(ROOT / "datasets" / "scenarios" / "happy-refund.yaml")
    runner = Runner(Home.resolve(tmp_path / "home"))
    try:
        ids = [runner.create(scenario, "v1") for _ in range(4)]
        doomed = ids[1]
        drive = runner.controller.drive

        def failing(run_id: str):
            if run_id == doomed:
                raise TypeError("an engine bug")
            return drive(run_id)

        monkeypatch.setattr(runner.controller, "drive", failing)
        with pytest.raises(RunsStopped) as caught:
            runner.drive_all(ids, concurrency=2)
        assert [run_id for run_id, _ in caught.value.failures] == [doomed]
        assert f"run {doomed} stopped by an unexpected error: TypeError: an engine bug" in str(caught.value)
        states = {run_id: runner.store.get_run(run_id).state for run_id in ids}
    finally:
        runner.close()
    assert states.pop(doomed) is State.READY
    assert set(states.values()) == {State.SUCCEEDED}


def test_a_waiting_runs_poll_goes_before_runs_not_yet_started(tmp_path: Path, monkeypatch) -> None:
    """A run waiting for background work is polled when its interval is up,
    not after every run still queued: its deadline, or its work's end, is
    seen then. (Behind the queue, the bundled deadline scenario overran its
    0.2 s deadline by a second in a busy batch.)"""
    import time
    from types import SimpleNamespace

    from loopledger.engine import State, _runner

    monkeypatch.setattr(_runner, "POLL_INTERVAL_S", 0.01)
    runner = Runner(Home.resolve(tmp_path / "home"))
    order: list[str] = []

    def drive_one(run_id: str):
        order.append(run_id)
        if run_id == "waiting" and order.count("waiting") == 1:
            return SimpleNamespace(state=State.WAITING_TOOL, state_version=3, held_elsewhere=False, batch_id=None)
        time.sleep(0.05)  # a run driven to its end takes a while
        return SimpleNamespace(state=State.SUCCEEDED, state_version=9, held_elsewhere=False, batch_id=None)

    monkeypatch.setattr(runner, "_drive_one", drive_one)
    try:
        runner.drive_all(["waiting", "a", "b", "c", "d"], concurrency=1)
    finally:
        runner.close()
    assert order == ["waiting", "a", "waiting", "b", "c", "d"]


def test_polls_never_keep_new_runs_from_starting(tmp_path: Path, monkeypatch) -> None:
    """Polls and new runs take free slots in turn: however many runs wait
    for their work, a new run starts at least every other slot."""
    import time
    from types import SimpleNamespace

    from loopledger.engine import State, _runner

    monkeypatch.setattr(_runner, "POLL_INTERVAL_S", 0.001)
    runner = Runner(Home.resolve(tmp_path / "home"))
    order: list[str] = []
    waiting = {f"w{i}" for i in range(6)}

    def drive_one(run_id: str):
        order.append(run_id)
        if run_id in waiting and order.count(run_id) <= 8:
            return SimpleNamespace(state=State.WAITING_TOOL, state_version=3, held_elsewhere=False, batch_id=None)
        time.sleep(0.01)
        return SimpleNamespace(state=State.SUCCEEDED, state_version=9, held_elsewhere=False, batch_id=None)

    monkeypatch.setattr(runner, "_drive_one", drive_one)
    fresh = [f"n{i}" for i in range(10)]
    try:
        runner.drive_all(sorted(waiting) + fresh, concurrency=1)
    finally:
        runner.close()
    last_start = order.index(fresh[-1])
    polls = [i for i, run_id in enumerate(order[:last_start]) if order.index(run_id) < i]
    assert polls, "the waiting runs were polled while new runs were still queued"
    assert not any(b == a + 1 for a, b in zip(polls, polls[1:])), order[:last_start + 1]
    assert all(order.count(run_id) == 9 for run_id in waiting) and all(order.count(n) == 1 for n in fresh)


def test_an_export_never_holds_up_the_batch(tmp_path: Path) -> None:
    """Exports run beside the runs: while one is writing, the other runs
    settle (their ``--json`` lines are written) and background work is
    polled. Here the first export blocks until every run has settled; a
    scheduler that exported in its own thread would never get there."""
    import threading

    scenarios = [load_scenario(ROOT / "datasets" / "scenarios" / f"{name}.yaml")
                 for name in ("happy-refund", "background-export", "happy-read-file")]
    runner = Runner(Home.resolve(tmp_path / "home"))
    all_settled = threading.Event()
    first_export_saw: list[bool] = []
    export = runner.recorder.recorder.export

    def slow_export():
        if not first_export_saw:
            first_export_saw.append(all_settled.wait(timeout=10))
        return export()

    runner.recorder.recorder.export = slow_export
    settled: list[str] = []
    try:
        ids = [runner.create(scenarios[i % 3], "v1") for i in range(6)]

        def on_settled(run_id: str) -> None:
            settled.append(run_id)
            if len(settled) == len(ids):
                all_settled.set()

        runner.drive_all(ids, concurrency=2, on_settled=on_settled)
        outcomes = [runner.outcome(run_id) for run_id in ids]
    finally:
        runner.close()
    assert first_export_saw == [True]
    assert sorted(settled) == sorted(ids)
    assert [o.status for o in outcomes] == ["SUCCEEDED"] * 6
    assert all_violations(tmp_path / "home") == []


def test_closing_lets_an_export_asked_for_finish_and_stops_its_thread() -> None:
    """A request made just before the runner closes its store is exported
    before close returns (it used to return at once and leave the export
    to run on a closed store), and the export thread ends."""
    import threading
    import time

    from loopledger.engine._runner import _CoalescingRecorder

    class SlowRecorder:
        exports = 0

        def export(self) -> None:
            time.sleep(0.2)
            SlowRecorder.exports += 1

    for _ in range(20):
        SlowRecorder.exports = 0
        coalescing = _CoalescingRecorder(SlowRecorder())  # type: ignore[arg-type]
        coalescing.request()
        coalescing.close()
        assert SlowRecorder.exports == 1
        assert not any(t.name == "export" and t.is_alive() for t in threading.enumerate())
    coalescing.request()  # after close: nothing more is exported
    assert SlowRecorder.exports == 1


def test_a_failed_export_is_raised_by_the_flush_that_follows() -> None:
    from loopledger.engine._runner import _CoalescingRecorder

    class Failing:
        def export(self) -> None:
            raise OSError("disk full")

    coalescing = _CoalescingRecorder(Failing())  # type: ignore[arg-type]
    coalescing.request()
    import pytest

    with pytest.raises(OSError, match="disk full"):
        coalescing.flush()
    coalescing.close()


def test_a_run_another_process_holds_for_a_moment_is_still_driven_by_its_maker(tmp_path: Path) -> None:
    """A resume beside a live ``run`` takes each run's claim to look it over
    (and lets go of the runs their maker will drive). A maker that met one
    of its own runs claimed at that moment reported it as it stood (READY,
    never driven) and went on, leaving it to nobody; it tries again."""
    import threading

    from loopledger.engine import State
    from loopledger.engine._sqlite import SQLiteRunStore

    scenario = load_scenario(ROOT / "datasets" / "scenarios" / "happy-refund.yaml")
    runner = Runner(Home.resolve(tmp_path / "home"))
    other = SQLiteRunStore(tmp_path / "home" / "journal.sqlite")  # its claims exclude ours as a process's would
    settled: list[str] = []
    ids = runner.create_all([(scenario, "v1")] * 3)
    held = ids[1]
    assert other.claim(held)
    letting_go = threading.Timer(0.5, other.release, (held,))
    letting_go.start()
    try:
        runner.drive_all(ids, concurrency=2, on_settled=settled.append)
        states = [runner.store.get_run(run_id).state for run_id in ids]
    finally:
        letting_go.join()
        runner.close()
        other.close()
    assert states == [State.SUCCEEDED] * 3
    assert sorted(settled) == sorted(ids)  # each reported once, when it ended
    assert all_violations(tmp_path / "home") == []
