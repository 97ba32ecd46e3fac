"""engine_history: per-transition cost late in one long run against early.

One run of ``STEPS`` tool-call steps (``workspace.read_file`` of a distinct
path each step: new evidence and a completed operation every step, no
repeated or oscillating calls, so no loop detector stops it) and a final
answer; model and tools instantaneous (the stub backend of
``bench_engine_overhead``), concurrency 1, exporter off.

Every commit is timed (wall ``perf_counter`` and CPU ``process_time``) by a
thin wrapper on the store's ``commit``; commits are mapped to steps through
the journal (``events.state_version`` -> ``step``). The cost of a window is
the time from the end of the last commit before its first step to the end
of the commit that closes its last step, divided by the transitions in
between. Windows: steps 6..25 ("step 10") and the 20 steps ending at
``STEPS`` ("step 1,000"). Best of ``ROUNDS`` runs per window (noise only
adds time). Ratio = late / early; goal <= 1.2.

Attribution, in the same runs: a few engine and validator functions are
wrapped with timers (a handful of calls per step, so the wrappers cost
nothing measurable) and their inclusive time per step is printed for both
windows, with the size of the step's context artifact. ``--profile`` adds
an untimed cProfile pass over both windows and prints the functions whose
cumulative time per step grows most.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import quick_flag, report  # noqa: E402
from bench_engine_overhead import bench_dir, journal_counts, long_scenario, make_runner  # noqa: E402

import loopledger.engine._controller as controller_mod  # noqa: E402
import loopledger.engine._records as records_mod  # noqa: E402
import loopledger.engine._store as store_mod  # noqa: E402
import loopledger.engine._view as view_mod  # noqa: E402
import loopledger.validators._loop_validators as loop_mod  # noqa: E402
import loopledger.validators._suite as suite_mod  # noqa: E402

WINDOW = 20
EARLY_FIRST = 6

#: (label, owner, attribute): inclusive wall time per step of each.
TIMED: tuple[tuple[str, Any, str], ...] = (
    ("READY: Controller._ready", controller_mod.Controller, "_ready"),
    ("  Controller._context_body (retrieval = all evidence)", controller_mod.Controller, "_context_body"),
    ("  canonical_json of artifacts (context hash)", records_mod, "canonical_json"),
    ("VALIDATING: Controller._validating", controller_mod.Controller, "_validating"),
    ("  Controller.decision_input", controller_mod.Controller, "decision_input"),
    ("    RunView.facts (all evidence, operations, history)", view_mod.RunView, "facts"),
    ("  Suite.evaluate (12 validators)", suite_mod.Suite, "evaluate"),
    ("    loop validators: _run (replays facts.history)", loop_mod, "_run"),
    ("RunView.step_ops (scans all ops)", view_mod.RunView, "step_ops"),
    ("journal commits (SQLRunStore.commit, fsync included)", store_mod.SQLRunStore, "commit"),
)

GC_LABEL = "garbage collector pauses (inside any of the above)"


class _Window:
    """Which window the step being driven belongs to (set in READY)."""

    def __init__(self, steps: int) -> None:
        self.bounds = {"early": (EARLY_FIRST, EARLY_FIRST + WINDOW - 1), "late": (steps - WINDOW + 1, steps)}
        self.current: str | None = None

    def at_step(self, step: int) -> str | None:
        return next((n for n, (a, b) in self.bounds.items() if a <= step <= b), None)


@contextmanager
def attributed(window: _Window, totals: dict[str, dict[str, float]],
               on_step: Callable[[str | None, str | None], None] | None = None) -> Iterator[None]:
    """Wrap the TIMED functions; add their inclusive time to ``totals[label][window]``.
    Re-entrant calls (canonical_json is recursive only internally) count once."""
    saved = []
    gc_bucket = totals.setdefault(GC_LABEL, {"early": 0.0, "late": 0.0, "early_cpu": 0.0, "late_cpu": 0.0})
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if window.current is None:
            return
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_bucket[window.current] += time.perf_counter() - gc_start[0]

    gc.callbacks.append(on_gc)
    for label, owner, attr in TIMED:
        inner = getattr(owner, attr)
        saved.append((owner, attr, inner))
        bucket = totals.setdefault(label, {"early": 0.0, "late": 0.0, "early_cpu": 0.0, "late_cpu": 0.0})

        def wrapper(*args: Any, __inner: Any = inner, __bucket: dict[str, float] = bucket,
                    __ready: bool = attr == "_ready", **kwargs: Any) -> Any:
            if __ready:
                # _ready(view, config) starts step view.step + 1.
                before, window.current = window.current, window.at_step(args[1].step + 1)
                if on_step is not None and before != window.current:
                    on_step(before, window.current)
            name = window.current
            if name is None:
                return __inner(*args, **kwargs)
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return __inner(*args, **kwargs)
            finally:
                __bucket[name] += time.perf_counter() - start
                __bucket[name + "_cpu"] += time.thread_time() - cpu

        setattr(owner, attr, wrapper)
    try:
        yield
    finally:
        gc.callbacks.remove(on_gc)
        for owner, attr, inner in reversed(saved):
            setattr(owner, attr, inner)


class _Timed:
    """Wraps ``store.commit``: (first expected state_version, state versions
    written, wall, cpu) after each (a chain of held moves writes several)."""

    def __init__(self, store: Any) -> None:
        self.inner = store.commit
        self.marks: list[tuple[int, int, float, float]] = []

    def __call__(self, *chain: Any) -> Any:
        result = self.inner(*chain)
        self.marks.append((chain[0].expected_version, len(chain), time.perf_counter(), time.process_time()))
        return result


def _journal(home: Path) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """state_version -> (step, transitions in that commit); step -> context bytes."""
    conn = sqlite3.connect(home / "journal.sqlite")
    try:
        rows = conn.execute(
            "SELECT state_version, MAX(step), SUM(kind = 'transition') FROM events "
            "WHERE kind != 'run_created' GROUP BY state_version").fetchall()
        sizes = conn.execute(
            "SELECT e.step, a.size_bytes FROM events e JOIN artifacts a "
            "ON a.artifact_id = json_extract(e.payload_json, '$.context_id') "
            "WHERE e.kind = 'transition' AND e.to_state = 'MODEL_RUNNING' AND e.from_state = 'READY'").fetchall()
    finally:
        conn.close()
    return {v: (s, t) for v, s, t in rows}, dict(sizes)


def timed_run(home: Path, steps: int) -> dict[str, Any]:
    window = _Window(steps)
    totals: dict[str, dict[str, float]] = {}
    with attributed(window, totals):
        # Built inside: the controller binds its handlers when it is made.
        runner = make_runner(home)
        run_id = runner.create(long_scenario(steps), "v1")
        timer = _Timed(runner.store)
        runner.store.commit = timer  # type: ignore[method-assign]
        start = time.perf_counter()
        runner.drive_all([run_id], 1)
        total = time.perf_counter() - start
        runner.close()
    counts = journal_counts(home)
    if set(counts["states"]) != {"SUCCEEDED"}:
        raise SystemExit(f"the long run did not succeed: {counts['states']}")
    vsteps, context_bytes = _journal(home)
    # marks[i]: the commit that moved expected_version -> expected_version + k.
    rows = [(vsteps[v + k][0], sum(vsteps[v + i][1] for i in range(1, k + 1)), wall, cpu)
            for v, k, wall, cpu in timer.marks]
    out: dict[str, Any] = {"total": {"wall": total, "transitions": counts["transitions"]}, "functions": totals}
    for name, (first, last) in window.bounds.items():
        idx = [i for i, r in enumerate(rows) if first <= r[0] <= last]
        i0, i1 = idx[0] - 1, idx[-1]
        transitions = sum(rows[i][1] for i in idx)
        out[name] = {
            "wall_us": (rows[i1][2] - rows[i0][2]) / transitions * 1e6,
            "cpu_us": (rows[i1][3] - rows[i0][3]) / transitions * 1e6,
            "transitions": transitions,
            "commits": len(idx),
            "context_bytes": sum(context_bytes.get(s, 0) for s in range(first, last + 1)) / WINDOW,
        }
    return out


def profiled_run(home: Path, steps: int, top: int = 15) -> list[str]:
    """cProfile both windows (whole steps, switched in READY); the functions
    whose cumulative time per step grows most from early to late."""
    window = _Window(steps)
    profiles = {name: cProfile.Profile() for name in window.bounds}

    def switch(before: str | None, after: str | None) -> None:
        if before is not None:
            profiles[before].disable()
        if after is not None:
            profiles[after].enable()

    with attributed(window, {}, on_step=switch):
        runner = make_runner(home)
        run_id = runner.create(long_scenario(steps), "v1")
        runner.drive_all([run_id], 1)
        if window.current is not None:
            profiles[window.current].disable()
        runner.close()
    stats = {}
    for name, prof in profiles.items():
        per: dict[str, tuple[float, float]] = {}
        for (file, line, func), (_cc, nc, _tt, ct, _callers) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
            if Path(file).name == Path(__file__).name:
                continue  # the timing wrappers themselves
            key = f"{Path(file).parent.name}/{Path(file).name}:{line}({func})"
            per[key] = (ct / WINDOW * 1e6, nc / WINDOW)
        stats[name] = per
    grow = sorted(((cl - stats["early"].get(k, (0.0, 0.0))[0], k, stats["early"].get(k, (0.0, 0.0)), (cl, nl))
                   for k, (cl, nl) in stats["late"].items()), reverse=True)
    lines = ["cProfile, per step (profiler overhead included): cumulative us early -> late, calls early -> late"]
    for d, key, (ce, ne), (cl, nl) in grow[:top]:
        lines.append(f"  +{d:9.0f} us  {key}  {ce:.0f} -> {cl:.0f} us, calls {ne:.1f} -> {nl:.1f}")
    return lines


def main() -> None:
    quick = quick_flag()
    steps = 200 if quick else 1000
    rounds = 1 if quick else 3
    results = []
    with bench_dir() as tmp:
        for r in range(rounds):
            results.append(timed_run(Path(tmp) / f"home{r}", steps))
        profile = profiled_run(Path(tmp) / "profiled", steps) if "--profile" in sys.argv[1:] else []
    best_early = min(results, key=lambda x: x["early"]["wall_us"])
    best_late = min(results, key=lambda x: x["late"]["wall_us"])
    early, late = best_early["early"], best_late["late"]
    early_cpu = min(x["early"]["cpu_us"] for x in results)
    late_cpu = min(x["late"]["cpu_us"] for x in results)
    for i, res in enumerate(results):
        print(f"round {i + 1}: early {res['early']['wall_us']:.0f} us wall / {res['early']['cpu_us']:.0f} us CPU, "
              f"late {res['late']['wall_us']:.0f} us wall / {res['late']['cpu_us']:.0f} us CPU per transition "
              f"({res['total']['transitions']} transitions in {res['total']['wall']:.1f} s)")
    tpe, tpl = early["transitions"] / WINDOW, late["transitions"] / WINDOW
    print(f"per step ({tpe:.0f} transitions): early {early['wall_us'] * tpe / 1e3:.2f} ms, "
          f"late {late['wall_us'] * tpl / 1e3:.2f} ms; context artifact {early['context_bytes'] / 1e3:.1f} kB -> "
          f"{late['context_bytes'] / 1e3:.1f} kB")
    print("inclusive time per step, early -> late, wall (thread CPU); best round of each window:")
    for label in [t[0] for t in TIMED] + [GC_LABEL]:
        e = best_early["functions"][label]["early"] / WINDOW * 1e3
        lt = best_late["functions"][label]["late"] / WINDOW * 1e3
        ec = min(r["functions"][label]["early_cpu"] for r in results) / WINDOW * 1e3
        lc = min(r["functions"][label]["late_cpu"] for r in results) / WINDOW * 1e3
        cpu = "" if label == GC_LABEL else f" ({ec:.3f} -> {lc:.3f} ms CPU)"
        print(f"  {label}: {e:.3f} -> {lt:.3f} ms{cpu}")
    for line in profile:
        print(line)
    report("engine_history", value=late["wall_us"], unit="us/transition", baseline=early["wall_us"], goal=1.2,
           n=steps, window_steps=WINDOW, early_steps=[EARLY_FIRST, EARLY_FIRST + WINDOW - 1],
           late_steps=[steps - WINDOW + 1, steps], early_cpu_us=round(early_cpu, 1),
           late_cpu_us=round(late_cpu, 1), cpu_ratio=round(late_cpu / early_cpu, 3),
           context_kb=[round(early["context_bytes"] / 1e3, 1), round(late["context_bytes"] / 1e3, 1)])


if __name__ == "__main__":
    main()
