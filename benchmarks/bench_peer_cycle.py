"""peer_cycle: one durable agent cycle in loopledger against LangGraph and DBOS.

A cycle is one model call and one tool call, both instantaneous, each made
durable before the next thing happens.

- loopledger: runs of a 2-entry script (one tool call, then the final
  answer) driven one after another (concurrency 1, stub backend of
  ``bench_engine_overhead``, exporter off). One run is counted as one cycle,
  although it does more than a cycle: a second model call (the final), its
  validation and the terminal state, all committed.
- LangGraph (``langgraph`` + ``langgraph-checkpoint-sqlite``): a StateGraph
  ``model -> tool -> END`` compiled with ``SqliteSaver`` on a file (WAL, the
  saver's own setup), invoked with a new thread id per cycle and
  ``durability="sync"`` (each checkpoint written before the next step).
- DBOS Transact (``dbos``): a workflow of two steps (model, tool) with a
  ``sqlite:///`` system database (DBOS's own pragmas), called once per cycle.

Peers come from the ``bench`` extra; a peer that cannot be imported or run
is reported as missing and the others are still measured. Rounds are
interleaved (same disk noise for all); the best round of each is kept.
Ratio = loopledger ms per cycle / best peer ms per cycle; goal <= 0.3.
Printed too: the bare fsync'd commit of ``journal_commit`` from this run.
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import quick_flag, report  # noqa: E402
from bench_engine_overhead import bare_us, bench_dir, cycle_scenario, journal_counts, make_runner  # noqa: E402


def loopledger_cycle(home: Path, cycles: int) -> float:
    """ms per cycle."""
    runner = make_runner(home)
    scenario = cycle_scenario()
    runner.drive_all([runner.create(scenario, "v1")], 1)  # warm-up
    ids = [runner.create(scenario, "v1") for _ in range(cycles)]
    start = time.perf_counter()
    runner.drive_all(ids, 1)
    elapsed = time.perf_counter() - start
    runner.close()
    states = journal_counts(home)["states"]
    if set(states) != {"SUCCEEDED"}:
        raise RuntimeError(f"loopledger runs did not all succeed: {states}")
    return elapsed / cycles * 1e3


def langgraph_cycle(home: Path, cycles: int) -> float:
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        task: int
        call: dict[str, Any]
        result: dict[str, Any]

    def model(state: State) -> State:
        return {"call": {"name": "workspace.read_file", "arguments": {"path": f"notes/{state['task']}.txt"}}}

    def tool(state: State) -> State:
        return {"result": {"ok": True, "subject": state["call"]["arguments"]["path"]}}

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_edge("model", "tool")
    graph.add_edge("tool", END)
    home.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(home / "langgraph.sqlite", check_same_thread=False)
    app = graph.compile(checkpointer=SqliteSaver(conn))

    def one(i: int) -> None:
        out = app.invoke({"task": i}, {"configurable": {"thread_id": f"t{i}"}}, durability="sync")
        assert out["result"]["ok"]

    one(-1)  # warm-up
    start = time.perf_counter()
    for i in range(cycles):
        one(i)
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / cycles * 1e3


_DBOS_WORKFLOW: dict[str, Callable[[int], Any]] = {}


def dbos_cycle(home: Path, cycles: int) -> float:
    from dbos import DBOS

    logging.getLogger("dbos").setLevel(logging.ERROR)
    home.mkdir(parents=True, exist_ok=True)
    DBOS(config={"name": "peer-cycle", "system_database_url": f"sqlite:///{home / 'dbos.sqlite'}",
                 "log_level": "ERROR"})
    if "cycle" not in _DBOS_WORKFLOW:
        # Registered once per process; DBOS keeps registrations across instances.
        @DBOS.step()
        def model(task: int) -> dict[str, Any]:
            return {"name": "workspace.read_file", "arguments": {"path": f"notes/{task}.txt"}}

        @DBOS.step()
        def tool(call: dict[str, Any]) -> dict[str, Any]:
            return {"ok": True, "subject": call["arguments"]["path"]}

        @DBOS.workflow()
        def cycle(task: int) -> dict[str, Any]:
            return tool(model(task))

        _DBOS_WORKFLOW["cycle"] = cycle
    cycle = _DBOS_WORKFLOW["cycle"]
    DBOS.launch()
    try:
        assert cycle(-1)["ok"]  # warm-up
        start = time.perf_counter()
        for i in range(cycles):
            cycle(i)
        elapsed = time.perf_counter() - start
    finally:
        DBOS.destroy(destroy_registry=False)
    return elapsed / cycles * 1e3


PEERS: dict[str, Callable[[Path, int], float]] = {"langgraph": langgraph_cycle, "dbos": dbos_cycle}


def main() -> None:
    quick = quick_flag()
    cycles = 30 if quick else 300
    rounds = 1 if quick else 3
    ours: list[float] = []
    peers: dict[str, list[float]] = {name: [] for name in PEERS}
    missing: dict[str, str] = {}
    bares: list[float] = []
    with bench_dir() as tmp:
        for r in range(rounds):
            bares.append(bare_us(Path(tmp), str(r)))
            ours.append(loopledger_cycle(Path(tmp) / f"ll{r}", cycles))
            for name, fn in PEERS.items():
                if name in missing:
                    continue
                try:
                    peers[name].append(fn(Path(tmp) / f"{name}{r}", cycles))
                except Exception as exc:  # noqa: BLE001 - a missing or broken peer is reported, not fatal
                    missing[name] = f"{type(exc).__name__}: {exc}"[:300]
    value = min(ours)
    measured = {name: min(v) for name, v in peers.items() if v and name not in missing}
    bare = min(bares)
    for name, why in missing.items():
        print(f"peer {name} missing: {why}")
    shown = ", ".join(f"{n} {ms:.3f} ms" for n, ms in measured.items())
    print(f"per cycle: loopledger {value:.3f} ms; {shown or 'no peer'}; bare fsync'd commit {bare / 1e3:.3f} ms")
    if not measured:
        report("peer_cycle", value=value, unit="ms/cycle", baseline=None, goal=0.3, n=cycles, best_peer=None,
               missing=missing, bare_commit_ms=round(bare / 1e3, 3))
        return
    best = min(measured, key=measured.__getitem__)
    report("peer_cycle", value=value, unit="ms/cycle", baseline=measured[best], goal=0.3, n=cycles,
           best_peer=best, peers_ms={n: round(ms, 3) for n, ms in measured.items()}, missing=missing,
           bare_commit_ms=round(bare / 1e3, 3))


if __name__ == "__main__":
    main()
