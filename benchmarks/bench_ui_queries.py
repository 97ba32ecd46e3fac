"""Benchmark ``ui_queries``: every workbench page's data loading on a large
synthetic data directory.

Writes 100,000 runs and 2,000,000 events (``--quick``: 5,000 and 100,000)
with the trace tables' real schemas, plus candidates, validations, loop
diagnoses, labels and one replay with decisions, diffs and summary. Then
runs each page's data functions (the same ones the pages call, uncached)
and reports the slowest page. Baseline: a bare DuckDB ``count(*)`` over the
same runs and events files. Goal: every page within 1 s (reported as
``max_page_s`` and ``met_1s``; the ratio is value / baseline).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import best_of, quick_flag, report  # noqa: E402

from loopledger.engine import arrow_schema  # noqa: E402
from loopledger.ui import _compare as c  # noqa: E402
from loopledger.ui import _queries as q  # noqa: E402
from loopledger.ui._data import Traces  # noqa: E402

STATES_CYCLE = ["READY", "MODEL_RUNNING", "VALIDATING", "TOOL_RUNNING"]
STATUSES = np.array(["SUCCEEDED", "FAILED", "BUDGET_EXHAUSTED", "POLICY_STOPPED", "WAITING_USER"])
REASONS = {"SUCCEEDED": "completed", "FAILED": "loop_detected", "BUDGET_EXHAUSTED": "max_steps",
           "POLICY_STOPPED": "policy", "WAITING_USER": "waiting_for_user"}
VALIDATORS = ["structure", "tool_exists", "tool_version", "tool_args_schema", "permission", "references",
              "output_rules", "completion_gate", "loop.repeated_call", "loop.repeated_error", "loop.no_progress",
              "loop.oscillation"]
SEGMENT_ROWS = 500_000  # the recorder writes many segments; so do we


def _write(folder: Path, table: pa.Table, rows_per_file: int = SEGMENT_ROWS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, max(table.num_rows, 1), rows_per_file)):
        pq.write_table(table.slice(start, rows_per_file), folder / f"seg-{i:08d}.parquet", row_group_size=122_880)


def _cast(table: str, columns: dict[str, object]) -> pa.Table:
    schema = arrow_schema(table)
    n = len(next(iter(columns.values())))
    arrays = [pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def build(home: Path, runs: int, events_per_run: int) -> dict[str, int]:
    rng = np.random.default_rng(7)
    traces = home / "traces"
    run_ids = np.array([f"task-{i % 500:03d}.v{1 + i % 2}.{i:08x}" for i in range(runs)])
    order = np.argsort(run_ids)  # the recorder writes rows ordered by run_id
    run_ids = run_ids[order]
    status = STATUSES[rng.choice(len(STATUSES), runs, p=[0.6, 0.2, 0.1, 0.05, 0.05])]
    start = np.datetime64("2026-01-01T00:00:00", "us") + (np.arange(runs) * 1_000_000)[order]
    step_count = rng.integers(1, 8, runs)
    spec = np.where(np.arange(runs) % 50 == 0,
                    '{"expect":{"decisions":[{"step":1,"validator":"completion_gate","verdict":"accept"}]}}',
                    '{"expect":{"decisions":[]}}')
    _write(traces / "runs", _cast("runs", {
        "run_id": run_ids, "thread_id": run_ids, "task_id": [r.split(".")[0] for r in run_ids],
        "tenant": np.where(np.arange(runs) % 3 == 0, "globex", "acme"),
        "prompt_version": [r.split(".")[1] for r in run_ids], "model_route": ["scripted"] * runs,
        "status": status, "reason": [REASONS[s] for s in status],
        "started_at": start, "ended_at": start + events_per_run * 20_000, "steps": step_count,
        "model_attempts": step_count + rng.integers(0, 2, runs), "tool_calls": rng.integers(0, 6, runs),
        "tokens_in": rng.integers(100, 5000, runs), "tokens_out": rng.integers(10, 500, runs),
        "cost_usd": rng.random(runs) / 100, "state_version": [events_per_run] * runs,
        "last_seq": [events_per_run] * runs, "spec_json": spec, "schema_version": [1] * runs,
    }))
    # Events: per run, transitions cycling through the states with a wait
    # now and then, interleaved with other event kinds.
    n = runs * events_per_run
    seq = np.tile(np.arange(1, events_per_run + 1), runs)
    kinds = np.where(seq % 3 == 0, "step_closed", "transition")
    kinds = np.where(seq % 7 == 0, "operation_result", kinds)
    to_state = np.array(STATES_CYCLE + ["WAITING_TOOL"])[seq % 5]
    to_state = np.where(kinds == "transition", to_state, None)
    ts = np.repeat(start, events_per_run) + seq * 20_000
    _write(traces / "events", _cast("events", {
        "run_id": np.repeat(run_ids, events_per_run), "seq": seq, "ts": ts, "kind": kinds,
        "from_state": np.where(kinds == "transition", np.array(STATES_CYCLE + ["WAITING_TOOL"])[(seq - 1) % 5], None),
        "to_state": to_state,
        "step": (seq // 5) + 1, "attempt": np.ones(n, dtype=np.int64), "state_version": seq,
        "payload_json": np.where(kinds == "transition", '{"context_id":"ab12"}', '{"operation_id":"op"}'),
        "schema_version": np.ones(n, dtype=np.int64),
    }))
    # Candidates: one per step and run, up to 3; every validator decides each.
    cand_steps = np.minimum(step_count, 3)
    cand_run = np.repeat(run_ids, cand_steps)
    cand_step = np.concatenate([np.arange(1, k + 1) for k in cand_steps])
    cand_id = np.array([f"{r}:{s}" for r, s in zip(cand_run, cand_step, strict=True)])
    nc = len(cand_id)
    _write(traces / "candidates", _cast("candidates", {
        "run_id": cand_run, "step": cand_step, "attempt": np.ones(nc, dtype=np.int64), "candidate_id": cand_id,
        "context_artifact_id": cand_id, "finish_reason": ["tool_calls"] * nc,
        "items_json": ['[{"type":"tool_call","name":"orders.get_order"}]'] * nc,
        "prompt_version": [r.split(".")[1] for r in cand_run], "model_route": ["scripted"] * nc,
    }))
    nv = nc * len(VALIDATORS)
    verdict = np.where(rng.random(nv) < 0.03, "reject", "accept")
    decisions = _cast("validations", {
        "run_id": np.repeat(cand_run, len(VALIDATORS)), "step": np.repeat(cand_step, len(VALIDATORS)),
        "attempt": np.ones(nv, dtype=np.int64), "candidate_id": np.repeat(cand_id, len(VALIDATORS)),
        "validator": np.tile(VALIDATORS, nc), "validator_version": ["1"] * nv, "suite_version": ["s-1"] * nv,
        "verdict": verdict, "code": np.where(verdict == "accept", "ok", "rejected"),
        "message": [""] * nv, "evidence_json": ["{}"] * nv, "seq": np.arange(nv), "schema_version": [1] * nv,
    })
    _write(traces / "validations", decisions)
    looped = run_ids[status == "FAILED"]
    nd = len(looped)
    _write(traces / "loop_diagnoses", _cast("loop_diagnoses", {
        "run_id": looped, "step": rng.integers(2, 7, nd),
        "detector": np.array(VALIDATORS[8:])[rng.integers(0, 4, nd)], "detector_version": ["1"] * nd,
        "pattern": ["repeated_call"] * nd, "evidence_json": ['{"count":3}'] * nd, "seq": [9] * nd,
        "schema_version": [1] * nd,
    }))
    _write(traces / "labels", _cast("labels", {
        "label_id": np.arange(1, 1001), "run_id": run_ids[:1000], "step": [1] * 1000, "attempt": [1] * 1000,
        "candidate_id": [f"{r}:1" for r in run_ids[:1000]], "validator": ["completion_gate"] * 1000,
        "expected_verdict": ["accept"] * 1000, "source": ["human"] * 1000, "note": [""] * 1000,
        "created_at": start[:1000], "schema_version": [1] * 1000,
    }))
    # A replay that flips 1% of the accepts to reject.
    flip = (verdict == "accept") & (rng.random(nv) < 0.01)
    replay_verdict = np.where(flip, "reject", verdict)
    root = home / "replays" / "r-bench"
    _write(root / "decisions", decisions.drop_columns(["seq", "schema_version"])
           .set_column(7, "verdict", pa.array(replay_verdict)))
    idx = np.nonzero(flip)[0]
    _write(root / "diffs", pa.table({
        "run_id": decisions["run_id"].take(idx), "step": decisions["step"].take(idx),
        "attempt": decisions["attempt"].take(idx), "candidate_id": decisions["candidate_id"].take(idx),
        "validator": decisions["validator"].take(idx), "baseline_verdict": pa.array(["accept"] * len(idx)),
        "replay_verdict": pa.array(["reject"] * len(idx)), "baseline_code": pa.array(["ok"] * len(idx)),
        "replay_code": pa.array(["rejected"] * len(idx)), "kind": pa.array(["change"] * len(idx)),
    }))
    _write(root / "summary", pa.table({
        "replay_id": ["r-bench"], "suite_version": ["s-2"], "baseline": ["recorded"], "candidates": [nc],
        "decisions": [nv], "flips": [len(idx)], "regressions": [0], "runs_diverged": [0], "seconds": [1.0],
    }))
    return {"runs": runs, "events": n, "candidates": nc, "decisions": nv}


def pages(t: Traces, run_id: str) -> dict[str, object]:
    """Each page's data loading, as the page does it on first open."""
    everything = q.RunFilter()
    return {
        "overview": lambda: q.overview(t),
        "runs": lambda: (q.run_filter_options(t), q.runs_count(t, everything),
                         q.runs_page(t, everything, "started_at", True, 0, 50)),
        "runs_filtered": lambda: q.runs_page(t, q.RunFilter(statuses=("FAILED",), detectors=("loop.no_progress",),
                                                            task="task-04"), "cost_usd", True, 50, 50),
        "run": lambda: q.run_detail(t, run_id),
        "loop_diagnoses": lambda: (q.diagnoses_summary(t), q.diagnoses_totals(t), q.diagnoses_by_step(t),
                                   q.diagnosis_findings(t, None, None, 0, 50)),
        "compare_validators": lambda: (c.sides(t), c.replay_summaries(t),
                                       c.compare_validators(t, "recorded", "r-bench")),
        "compare_prompts": lambda: (q.prompt_versions(t), q.prompt_compare(t, "v1", "v2")),
        "labels": lambda: (c.labels_summary(t), c.labels_count(t), c.labels_page(t, None, 0, 50)),
    }


def main() -> None:
    quick = quick_flag()
    runs, per_run = (5_000, 20) if quick else (100_000, 20)
    repeats = 2 if quick else 3
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        home = Path(tmp)
        started = time.perf_counter()
        sizes = build(home, runs, per_run)
        print(f"built {sizes} in {time.perf_counter() - started:.1f}s")
        t = Traces(home)
        run_id = t.rows("SELECT run_id FROM runs ORDER BY run_id LIMIT 1 OFFSET 12345 % (SELECT count(*) FROM runs)")[0][0]
        baseline = best_of(repeats, lambda: t.rows("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM events)"))
        seconds = {}
        for name, load in pages(t, run_id).items():
            seconds[name] = best_of(repeats, load)
            print(f"{name:20s} {seconds[name]:.3f} s")
        # The general path (two arbitrary suites, no diffs table to lean on).
        original = c._diffs_apply
        c._diffs_apply = lambda *_: False
        full_join = best_of(1, lambda: c.compare_validators(t, "recorded", "r-bench"))
        c._diffs_apply = original
        print(f"{'compare (full join)':20s} {full_join:.3f} s  (two replays without a diffs table between them)")
        t.close()
    slowest = max(seconds, key=seconds.get)
    value = seconds[slowest]
    report("ui_queries", value=value, unit="s", baseline=baseline, goal=round(1.0 / baseline, 1) if baseline else 1.0,
           n=sizes["events"], runs=sizes["runs"], slowest_page=slowest, max_page_s=round(value, 4),
           met_1s=value <= 1.0, full_join_s=round(full_join, 4),
           pages={k: round(v, 4) for k, v in seconds.items()})


if __name__ == "__main__":
    main()
