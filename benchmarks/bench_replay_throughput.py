"""replay_throughput: replay 1M synthetic candidates with the default suite.

``python benchmarks/bench_replay_throughput.py [--quick] [--candidates N] [--data DIR] [--workers W]``

Value: seconds for ``replay(traces, "default", write_to=...)`` (partitioning,
every candidate re-decided, diffs, batch loop detectors, replay tables
written), workers on every core. Baseline, same run and same files:
DuckDB scanning the candidate and context bodies and ``json.loads`` of each
(the bare work of reading what a replay reads). Ratio = value / baseline;
goal ≤ 4. Also reported: candidates per second (goal ≥ 50,000) and the
peak resident memory of the replay's whole process tree (goal < 2 GB).
The synthetic set is the engine's own recorded runs, cloned
(``synthetic_traces.py``), so the replay must report zero flips: checked.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from _common import report
from synthetic_traces import generate


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as handle:
                total += int(handle.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(children.get(pid, ()))
    return total


class PeakSampler:
    def __init__(self, interval: float = 0.2) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(me))
            self._stop.wait(interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def baseline_seconds(traces: Path) -> float:
    import json

    import duckdb

    start = time.perf_counter()
    con = duckdb.connect()
    files = f"read_parquet('{traces}/artifacts/*.parquet')"
    reader = con.execute(f"SELECT body FROM {files} WHERE kind IN ('candidate', 'context')").to_arrow_reader(50_000)
    loads = json.loads
    for batch in reader:
        for body in batch.column(0).to_pylist():
            loads(body)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--candidates", type=int, default=None)
    parser.add_argument("--data", type=Path, default=None, help="keep (and reuse) the synthetic traces here")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    n = args.candidates or (10_000 if args.quick else 1_000_000)
    scratch = Path(tempfile.mkdtemp(prefix="ll-bench-replay-"))
    data = args.data or scratch / "traces"
    try:
        marker = data / f".candidates-{n}"
        if not marker.exists():
            shutil.rmtree(data, ignore_errors=True)
            started = time.perf_counter()
            made = generate(data, n)
            marker.write_text(str(made))
            print(f"generated {made:,} candidates in {time.perf_counter() - started:.1f}s")
        made = int(marker.read_text())
        from loopledger.replay import replay

        base = baseline_seconds(data)
        with PeakSampler() as sampler:
            started = time.perf_counter()
            result = replay(data, "default", write_to=scratch / "replays", workers=args.workers or os.cpu_count())
            value = time.perf_counter() - started
        s = result.summary
        assert s.flips == 0 and s.run_errors == 0, s
        assert s.candidates_rerun == made, (s.candidates_rerun, made)
        rate = s.candidates_rerun / value
        print(f"replay {value:.1f}s ({rate:,.0f} candidates/s), baseline {base:.1f}s, "
              f"peak RSS {sampler.peak / 2**20:,.0f} MB, {s.decisions:,} decisions, 0 flips")
        report("replay_throughput", value=value, unit="s", baseline=base, goal=4.0, n=s.candidates_rerun,
               candidates_per_s=round(rate), candidates_per_s_goal=50_000,
               peak_rss_mb=round(sampler.peak / 2**20), peak_rss_goal_mb=2048,
               workers=args.workers or os.cpu_count())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
