"""Several OS processes committing to the same run at once.

Every commit is read-then-commit with the ``state_version`` read. The
compare-and-set must let each version be won exactly once, keep seq gapless,
and refuse every loser with ``StaleStateVersion``.
"""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter
from pathlib import Path

import pytest

from journal_kit import open_store, race_worker
from loopledger.engine import Commit, NewRun, State

WORKERS = 3
LOCKSTEP_ROUNDS = 25
FREE_ATTEMPTS = 60


@pytest.mark.slow
def test_each_state_version_is_won_exactly_once(store_kind: str, journal_at: str | Path, tmp_path: Path) -> None:
    path = journal_at
    store = open_store(store_kind, path)
    store.create_run(NewRun(run_id="shared", task_id="t", tenant="acme"))
    store.commit(Commit(run_id="shared", expected_version=1, to_state=State.MODEL_RUNNING))
    base = store.get_run("shared")
    assert base.state_version == 2

    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS, timeout=120)
    outs = [tmp_path / f"worker-{n}.json" for n in range(WORKERS)]
    procs = [
        ctx.Process(target=race_worker, args=(str(path), "shared", n, LOCKSTEP_ROUNDS, FREE_ATTEMPTS, barrier, str(outs[n])))
        for n in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    assert [proc.exitcode for proc in procs] == [0] * WORKERS

    outcomes = {n: json.loads(outs[n].read_text()) for n in range(WORKERS)}
    wins = [(n, o) for n, results in outcomes.items() for o in results if o["won"]]
    losses = [(n, o) for n, results in outcomes.items() for o in results if not o["won"]]

    # Every attempt ended in a win or a StaleStateVersion, nothing else.
    for results in outcomes.values():
        assert len(results) == LOCKSTEP_ROUNDS + FREE_ATTEMPTS

    # Lock-step: all workers read the same version, exactly one of them won it.
    for index in range(LOCKSTEP_ROUNDS):
        round_results = [o for results in outcomes.values() for o in results if o["phase"] == "lockstep" and o["i"] == index]
        assert sorted(o["won"] for o in round_results) == [False] * (WORKERS - 1) + [True]
        [winner] = [o for o in round_results if o["won"]]
        for loser in (o for o in round_results if not o["won"]):
            assert (loser["expected"], loser["actual"]) == (winner["state_version"] - 1, winner["state_version"])
    lockstep_losses = Counter(n for n, o in losses if o["phase"] == "lockstep")
    assert sum(lockstep_losses.values()) == LOCKSTEP_ROUNDS * (WORKERS - 1)
    for _, loss in losses:
        assert loss["actual"] > loss["expected"]

    # Each state_version won exactly once, all of them, in order of seq.
    final = store.get_run("shared")
    versions = sorted(o["state_version"] for _, o in wins)
    assert versions == list(range(base.state_version + 1, final.state_version + 1))
    assert len(wins) + len(losses) == WORKERS * (LOCKSTEP_ROUNDS + FREE_ATTEMPTS)

    # No seq gaps, and each win owns exactly the events it committed.
    events = store.events("shared")
    assert [e.seq for e in events] == list(range(1, final.last_seq + 1))
    by_seq = {e.seq: e for e in events}
    covered: list[int] = []
    for worker, win in sorted(wins, key=lambda w: w[1]["state_version"]):
        span = list(range(win["first_seq"], win["last_seq"] + 1))
        assert len(span) == 2
        covered += span
        transition, tick = (by_seq[s] for s in span)
        assert (transition.kind, tick.kind) == ("transition", "tick")
        assert transition.state_version == tick.state_version == win["state_version"]
        assert transition.payload == {"worker": worker, "phase": win["phase"], "i": win["i"]}
        assert tick.payload == {"worker": worker, "i": win["i"]}
    assert covered == list(range(base.last_seq + 1, final.last_seq + 1))
    store.close()
