"""engine_overhead: microseconds per transition of sequential scripted runs.

Each run is a refund-like script (look the order up, refund it, answer with
the evidence): the scripted model and the tools are instantaneous (an
in-memory stub backend), so what is timed is the engine itself: building
contexts and candidates, validation with the default suite, and the
journal commits. Runs are driven one after another (concurrency 1, no group
commit); the Parquet exporter is switched off. A transition is an ``events``
row of kind ``transition`` in the journal.

Baseline, same process, same disk: ``bench_journal_commit.bench_bare``, a
bare fsync'd SQLite commit (WAL, synchronous=FULL). Ratio = engine µs per
transition / bare µs per commit; goal <= 2.

Also printed: commits per transition and CPU time (``process_time``) per
transition, so the figure can be explained (fsync wait vs Python work).

This module also holds the harness the other engine benchmarks import
(stub backend, runner without exporter, scenario builders, journal counts).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import quick_flag, report  # noqa: E402
from bench_journal_commit import bench_bare  # noqa: E402

import loopledger.engine._controller as controller_mod  # noqa: E402
import loopledger.engine._records as records_mod  # noqa: E402
import loopledger.engine._runner as runner_mod  # noqa: E402
import loopledger.engine._store as store_mod  # noqa: E402
import loopledger.validators._suite as suite_mod  # noqa: E402
from loopledger.engine._backends import ToolOutcome, ToolRequest, WorkStatus  # noqa: E402
from loopledger.engine._home import Home  # noqa: E402
from loopledger.engine._runner import Runner  # noqa: E402
from loopledger.engine._scenario import Scenario, parse_scenario  # noqa: E402
from loopledger.engine._tools import EVIDENCE_KIND  # noqa: E402

BARE_N = 500

# --- the harness shared by the engine benchmarks ------------------------------------


class StubBackend:
    """Instantaneous tools: every call succeeds at once, in memory, with one
    piece of evidence about its subject (the order id, path, ...). Made,
    like the demo backend, from the data directory, which it does not use."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home

    def execute(self, req: ToolRequest) -> ToolOutcome:
        args = req.arguments
        subject = str(args.get("order_id") or args.get("path") or args.get("suite") or args.get("service")
                      or req.operation_id)
        return ToolOutcome(outcome="success", status="succeeded", result={"ok": True, "subject": subject},
                           evidence=({"kind": EVIDENCE_KIND.get(req.tool, "done"), "subject": subject},),
                           error_code=None, retry_after_s=None, work_id=None, executed=True)

    def lookup(self, idempotency_key: str, *, run_id: str | None = None,
               fence: int | None = None) -> ToolOutcome | None:
        return None

    def poll_work(self, work_id: str) -> WorkStatus:
        raise KeyError(work_id)

    def cancel_work(self, work_id: str) -> bool | None:
        return False

    def side_effects(self, run_id: str) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def make_runner(home: Path) -> Runner:
    """A runner on ``home`` with the stub backend and no Parquet export."""
    return Runner(Home.resolve(home), backend=StubBackend, export=False)


def refund_scenario() -> Scenario:
    """Three steps: get the order, refund it, final answer with evidence."""
    return parse_scenario({
        "id": "bench-refund",
        "contract": {"goal": "Refund order ORD-1031 in full", "required_evidence": ["refund_confirmed"],
                     "allowed_tools": ["orders.get_order", "payments.refund"]},
        "model": [
            {"tool_calls": [{"name": "orders.get_order", "arguments": {"order_id": "ORD-1031"}}]},
            {"tool_calls": [{"name": "payments.refund", "arguments": {"order_id": "ORD-1031", "amount": 25.0}}]},
            {"final": "Refund of 25.00 issued for ORD-1031.",
             "claims": [{"text": "refund issued", "evidence": ["refund_confirmed:ORD-1031"]}]},
        ],
        "expect": {"status": "SUCCEEDED"},
    }, source="bench")


def cycle_scenario() -> Scenario:
    """One agent cycle: one tool call, then the final answer."""
    return parse_scenario({
        "id": "bench-cycle",
        "contract": {"goal": "Read the notes", "required_evidence": ["file_read"],
                     "allowed_tools": ["workspace.read_file"]},
        "model": [
            {"tool_calls": [{"name": "workspace.read_file", "arguments": {"path": "notes.txt"}}]},
            {"final": "Read notes.txt.", "claims": [{"text": "read", "evidence": ["file_read:notes.txt"]}]},
        ],
        "expect": {"status": "SUCCEEDED"},
    }, source="bench")


def long_scenario(steps: int) -> Scenario:
    """``steps`` tool-call steps with distinct arguments (new evidence each
    step, no repeated or oscillating calls), then the final answer."""
    model: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "workspace.read_file", "arguments": {"path": f"notes/{i:05d}.txt"}}]}
        for i in range(steps)
    ]
    model.append({"final": "Read every note.",
                  "claims": [{"text": "read", "evidence": ["file_read:notes/00000.txt"]}]})
    return parse_scenario({
        "id": "bench-long",
        "contract": {"goal": "Read every note", "required_evidence": ["file_read"],
                     "allowed_tools": ["workspace.read_file"]},
        "model": model,
        "expect": {"status": "SUCCEEDED"},
    }, source="bench")


def journal_counts(home: Path) -> dict[str, Any]:
    """Transitions, commits (distinct run/timestamp: the events of one
    commit, held moves included, share its moment) and terminal states, read
    from the journal after the runner closed it."""
    conn = sqlite3.connect(home / "journal.sqlite")
    try:
        transitions = conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'transition'").fetchone()[0]
        commits = conn.execute(
            "SELECT COUNT(*) FROM (SELECT DISTINCT run_id, ts FROM events WHERE kind != 'run_created')"
        ).fetchone()[0]
        states = dict(conn.execute("SELECT state, COUNT(*) FROM runs GROUP BY state").fetchall())
    finally:
        conn.close()
    return {"transitions": transitions, "commits": commits, "states": states}


def bare_us(tmp: Path, tag: str, n: int = BARE_N) -> float:
    """The bare fsync'd commit of ``journal_commit``, measured now."""
    return bench_bare(tmp / f"bare-{tag}.sqlite", n)


def bench_dir() -> Any:
    return tempfile.TemporaryDirectory(dir=os.environ.get("LOOPLEDGER_BENCH_DIR"))


@contextmanager
def timed_calls(targets: tuple[tuple[str, Any, str], ...]) -> Iterator[dict[str, float]]:
    """Wrap ``owner.attr`` of each target with a timer; yields label -> seconds
    (inclusive; a nested call of the same label counts once)."""
    totals = {label: 0.0 for label, _, _ in targets}
    totals.update({label + "_cpu": 0.0 for label, _, _ in targets})
    saved = []
    for label, owner, attr in targets:
        inner = getattr(owner, attr)
        saved.append((owner, attr, inner))
        depth = [0]

        def wrapper(*args: Any, __inner: Any = inner, __label: str = label, __depth: list[int] = depth,
                    **kwargs: Any) -> Any:
            __depth[0] += 1
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return __inner(*args, **kwargs)
            finally:
                __depth[0] -= 1
                if __depth[0] == 0:
                    totals[__label] += time.perf_counter() - start
                    totals[__label + "_cpu"] += time.process_time() - cpu

        setattr(owner, attr, wrapper)
    try:
        yield totals
    finally:
        for owner, attr, inner in reversed(saved):
            setattr(owner, attr, inner)


@contextmanager
def commits_by_kind() -> Iterator[dict[str, list[float]]]:
    """Journal commits grouped by their target states (a chain of held moves
    and the commit that writes them, e.g. ``VALIDATING>TOOL_RUNNING``):
    kind -> [count, wall s, CPU s]."""
    kinds: dict[str, list[float]] = {}
    inner = store_mod.SQLRunStore.commit

    def commit(self: Any, *chain: Any) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return inner(self, *chain)
        finally:
            kind = ">".join(c.to_state.value if c.to_state is not None else "(events)" for c in chain)
            entry = kinds.setdefault(kind, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - start
            entry[2] += time.process_time() - cpu

    store_mod.SQLRunStore.commit = commit  # type: ignore[method-assign]
    try:
        yield kinds
    finally:
        store_mod.SQLRunStore.commit = inner  # type: ignore[method-assign]


# --- engine_overhead -------------------------------------------------------------

#: Where a transition's time goes (inclusive wall time, measured in an extra,
#: untimed pass so the wrappers do not touch the reported figure).
SPLIT: tuple[tuple[str, Any, str], ...] = (
    ("journal_commit", store_mod.SQLRunStore, "commit"),
    ("suite_evaluate", suite_mod.Suite, "evaluate"),
    ("decision_input", controller_mod.Controller, "decision_input"),
    ("context_body", controller_mod.Controller, "_context_body"),
    ("artifact_hashing", records_mod, "canonical_json"),
    ("model_collect", controller_mod, "collect"),
    ("run_load", controller_mod.Controller, "load"),
    ("run_config", runner_mod, "config_for"),
)


def run_sequential(home: Path, runs: int) -> dict[str, Any]:
    runner = make_runner(home)
    scenario = refund_scenario()
    ids = [runner.create(scenario, "v1") for _ in range(runs)]
    # Warm-up outside the timed region: suite load, schema caches.
    warm = runner.create(scenario, "v1")
    runner.drive_all([warm], 1)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    runner.drive_all(ids, 1)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    runner.close()
    counts = journal_counts(home)
    # The warm-up run's transitions and commits are not in the timed region.
    per_run_t = counts["transitions"] / (runs + 1)
    per_run_c = counts["commits"] / (runs + 1)
    return {"wall": wall, "cpu": cpu, "transitions": round(per_run_t * runs), "commits": round(per_run_c * runs),
            "states": counts["states"]}


def main() -> None:
    quick = quick_flag()
    runs = 30 if quick else 200
    rounds = 1 if quick else 3
    best: dict[str, Any] | None = None
    bares: list[float] = []
    with bench_dir() as tmp:
        for r in range(rounds):
            # Interleaved, so disk noise hits both alike; best round kept.
            bares.append(bare_us(Path(tmp), str(r)))
            res = run_sequential(Path(tmp) / f"home{r}", runs)
            res["us"] = res["wall"] / res["transitions"] * 1e6
            if best is None or res["us"] < best["us"]:
                best = res
        with timed_calls(SPLIT) as parts, commits_by_kind() as kinds:
            split_run = run_sequential(Path(tmp) / "split", runs)
    assert best is not None
    baseline = min(bares)
    if set(best["states"]) != {"SUCCEEDED"}:
        raise SystemExit(f"runs did not all succeed: {best['states']}")
    t = best["transitions"]
    split = {
        "transitions_per_run": round(t / runs, 2),
        "commits_per_transition": round(best["commits"] / t, 3),
        "cpu_us_per_transition": round(best["cpu"] / t * 1e6, 1),
        "wall_us_per_transition": round(best["us"], 1),
        "io_wait_us_per_transition": round((best["wall"] - best["cpu"]) / t * 1e6, 1),
        "bare_commit_us": round(baseline, 1),
    }
    st = split_run["transitions"]
    known = {name: secs / st * 1e6 for name, secs in parts.items() if not name.endswith("_cpu")}
    split["journal_commit_cpu_us"] = round(parts["journal_commit_cpu"] / st * 1e6, 1)
    split["split_pass_cpu_us"] = round(split_run["cpu"] / st * 1e6, 1)
    # Disjoint: the commit, and Python work outside it (decision_input and
    # artifact hashing run outside commits; suite_evaluate outside both).
    split["split_pass_wall_us"] = round(split_run["wall"] / st * 1e6, 1)
    for name, us in known.items():
        split[f"{name}_us"] = round(us, 1)
    split["other_us"] = round(split_run["wall"] / st * 1e6 - sum(known.values()), 1)
    print("split pass, us per transition: " + ", ".join(f"{k} {v:.1f}" for k, v in known.items())
          + f", other {split['other_us']:.1f} (of {split['split_pass_wall_us']:.1f}); CPU "
          f"{split['split_pass_cpu_us']:.1f}, of which in commits {split['journal_commit_cpu_us']:.1f}")
    print("journal commits by target state (count per run, wall us, CPU us each): " + ", ".join(
        f"{k} {n / (runs + 1):.0f} x {w / n * 1e6:.0f}/{c / n * 1e6:.0f}" for k, (n, w, c) in sorted(kinds.items())))
    print(f"{runs} runs, {t} transitions, {best['commits']} commits; "
          f"{split['wall_us_per_transition']} us/transition wall, {split['cpu_us_per_transition']} us CPU, "
          f"{split['commits_per_transition']} commits/transition; bare commit {baseline:.1f} us")
    report("engine_overhead", value=best["us"], unit="us/transition", baseline=baseline, goal=2, n=t, **split)


if __name__ == "__main__":
    main()
