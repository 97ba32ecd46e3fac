"""engine_throughput: transitions per second with 64 runs driven at once.

1,000 refund-like scripted runs (model and tools instantaneous: the stub
backend of ``bench_engine_overhead``), ``Runner.drive_all(ids, 64)``: 64
worker threads, group commit on (concurrent commits share one transaction
and one fsync; each caller returns only once its commit is durable). The
Parquet exporter is switched off. Transitions are the journal's ``events``
rows of kind ``transition``.

Baseline, same process: bare fsync'd SQLite commits per second,
1e6 / ``bench_journal_commit.bench_bare`` µs. Ratio = engine transitions/s /
bare commits/s; goal >= 0.5.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import quick_flag, report  # noqa: E402
from bench_engine_overhead import bare_us, bench_dir, journal_counts, make_runner, refund_scenario  # noqa: E402

CONCURRENCY = 64


def run_concurrent(home: Path, runs: int) -> dict[str, Any]:
    runner = make_runner(home)
    scenario = refund_scenario()
    warm = runner.create(scenario, "v1")
    runner.drive_all([warm], 1)
    ids = [runner.create(scenario, "v1") for _ in range(runs)]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    runner.drive_all(ids, CONCURRENCY)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    runner.close()
    counts = journal_counts(home)
    per_run = counts["transitions"] / (runs + 1)
    transitions = round(per_run * runs)
    return {"wall": wall, "cpu": cpu, "transitions": transitions, "states": counts["states"],
            "tps": transitions / wall}


def main() -> None:
    quick = quick_flag()
    runs = 128 if quick else 1000
    rounds = 1 if quick else 3
    best: dict[str, Any] | None = None
    bares: list[float] = []
    with bench_dir() as tmp:
        for r in range(rounds):
            bares.append(bare_us(Path(tmp), str(r)))
            res = run_concurrent(Path(tmp) / f"home{r}", runs)
            if set(res["states"]) != {"SUCCEEDED"}:
                raise SystemExit(f"runs did not all succeed: {res['states']}")
            if best is None or res["tps"] > best["tps"]:
                best = res
    assert best is not None
    bare = min(bares)
    baseline = 1e6 / bare
    t = best["transitions"]
    print(f"{runs} runs at concurrency {CONCURRENCY}: {t} transitions in {best['wall']:.2f} s "
          f"= {best['tps']:.0f} transitions/s (CPU {best['cpu'] / t * 1e6:.0f} us/transition); "
          f"bare commit {bare:.1f} us = {baseline:.0f} commits/s")
    report("engine_throughput", value=best["tps"], unit="transitions/s", baseline=baseline, goal=0.5, n=t,
           higher_is_better=True, runs=runs, concurrency=CONCURRENCY,
           cpu_us_per_transition=round(best["cpu"] / t * 1e6, 1), bare_commit_us=round(bare, 1))


if __name__ == "__main__":
    main()
