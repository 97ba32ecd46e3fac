"""engine_throughput: transitions per second with 64 runs driven at once.

1,000 refund-like scripted runs (model and tools instantaneous: the stub
backend of ``bench_engine_overhead``), ``Runner.drive_all(ids, 64,
workers=W)``: 64 threads in all, spread over W worker processes, one per
core (``loopledger run --workers``; engine/_workers.py), each with group
commit on (concurrent commits share one transaction and one fsync; each
caller returns only once its commit is durable). The Parquet exporter is
switched off. Transitions are the journal's ``events`` rows of kind
``transition``. The same runs in one process (W = 1) are measured and
printed beside it.

Baseline, same process: bare fsync'd SQLite commits per second,
1e6 / ``bench_journal_commit.bench_bare`` µs. Ratio = engine transitions/s /
bare commits/s; goal >= 0.5.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import quick_flag, report  # noqa: E402
from bench_engine_overhead import bare_us, bench_dir, journal_counts, make_runner, refund_scenario  # noqa: E402

CONCURRENCY = 64
WORKERS = os.cpu_count() or 1


def run_concurrent(home: Path, runs: int, workers: int) -> dict[str, Any]:
    runner = make_runner(home)
    scenario = refund_scenario()
    # Warm-up outside the timed region: suite load, schema caches, and with
    # workers the fork server, which imports the engine once per process.
    runner.drive_all([runner.create(scenario, "v1") for _ in range(workers)], workers, workers=workers)
    ids = [runner.create(scenario, "v1") for _ in range(runs)]
    cpu0, wall0 = time.process_time() + runner.worker_cpu_s, time.perf_counter()
    runner.drive_all(ids, CONCURRENCY, workers=workers)
    wall, cpu = time.perf_counter() - wall0, time.process_time() + runner.worker_cpu_s - cpu0
    runner.close()
    counts = journal_counts(home)
    per_run = counts["transitions"] / (runs + workers)
    transitions = round(per_run * runs)
    return {"wall": wall, "cpu": cpu, "transitions": transitions, "states": counts["states"],
            "tps": transitions / wall}


def main() -> None:
    quick = quick_flag()
    runs = 128 if quick else 1000
    rounds = 1 if quick else 3
    best: dict[int, dict[str, Any]] = {}
    bares: list[float] = []
    with bench_dir() as tmp:
        for r in range(rounds):
            bares.append(bare_us(Path(tmp), str(r)))
            for workers in sorted({1, WORKERS}):
                res = run_concurrent(Path(tmp) / f"home{r}-{workers}", runs, workers)
                if set(res["states"]) != {"SUCCEEDED"}:
                    raise SystemExit(f"runs did not all succeed: {res['states']}")
                if workers not in best or res["tps"] > best[workers]["tps"]:
                    best[workers] = res
    bare = min(bares)
    baseline = 1e6 / bare
    for workers, res in sorted(best.items()):
        t = res["transitions"]
        print(f"{runs} runs at concurrency {CONCURRENCY}, {workers} process(es): {t} transitions in "
              f"{res['wall']:.2f} s = {res['tps']:.0f} transitions/s (CPU {res['cpu'] / t * 1e6:.0f} us/transition)")
    print(f"bare commit {bare:.1f} us = {baseline:.0f} commits/s")
    top, single = best[WORKERS], best[1]
    t = top["transitions"]
    report("engine_throughput", value=top["tps"], unit="transitions/s", baseline=baseline, goal=0.5, n=t,
           higher_is_better=True, runs=runs, concurrency=CONCURRENCY, workers=WORKERS,
           one_process_tps=round(single["tps"]), cpu_us_per_transition=round(top["cpu"] / t * 1e6, 1),
           bare_commit_us=round(bare, 1))


if __name__ == "__main__":
    main()
