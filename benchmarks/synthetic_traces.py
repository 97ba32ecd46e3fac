"""Synthetic traces for the replay benchmark: ``python benchmarks/synthetic_traces.py OUT --candidates N``.

The bundled scenarios are recorded once (scripted model, real engine), and
their runs are cloned until the trace set holds N validated candidates.
Each clone is a distinct run with its own artifacts: its run id is new, and
its contexts carry the clone's id in ``memory`` (which no validator reads),
so every context, and every candidate pointing at one, has a new body and
a new content id (sha256 of the body, as the engine computes it). The items,
contexts (tool registry snapshot, contract, messages; ~5 kB), events and
recorded decisions are the engine's own, so replaying the clones with the
recording suite must give zero flips: a check the benchmark makes.

Tables are written like the recorder writes them: zstd Parquet, one
segment per batch of runs, rows sorted by run within a segment, artifacts in
creation order. Tool results and final answers (which a replay never reads)
are left out.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Runs per written segment (one recorder export's worth).
SEGMENT_RUNS = 5_000


def record_template(home: Path) -> Path:
    """Record the bundled scenarios once; return the trace folder."""
    if not (home / "traces" / "candidates").is_dir():
        exe = Path(sys.executable).with_name("loopledger")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
        subprocess.run([str(exe), "run", str(REPO / "datasets" / "scenarios"), "--home", str(home), "--json"],
                       check=True, capture_output=True, env=env)
    return home / "traces"


def _read(traces: Path, table: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((traces / table).glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist() if files else []


def generate(out: Path, candidates: int, template_home: Path | None = None) -> int:
    """Write at least ``candidates`` validated candidates under ``out``; return how many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loopledger.engine import arrow_schema

    tmp = None
    if template_home is None:
        tmp = tempfile.TemporaryDirectory(prefix="ll-template-")
        template_home = Path(tmp.name)
    traces = record_template(template_home)
    runs = _read(traces, "runs")
    by_run: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for table in ("events", "candidates", "validations"):
        for row in _read(traces, table):
            by_run[row["run_id"]][table].append(row)
    every_artifact = _read(traces, "artifacts")
    artifacts = {a["artifact_id"]: a for a in every_artifact if a["kind"] in ("context", "candidate")}
    # Contexts name the tool registry snapshot by id: it is copied once, as is.
    registries = [a for a in every_artifact if a["kind"] == "tool_registry"]
    per_set = sum(sum(1 for e in by_run[r["run_id"]]["events"] if e["to_state"] == "VALIDATING") for r in runs)
    clones = -(-candidates // per_set)

    # Per template run: the ids its rows mention (run id, its artifacts), in
    # the order their bodies must be rewritten (a context names the previous one).
    plans = []
    for run in runs:
        rid = run["run_id"]
        owned: list[str] = []
        for c in by_run[rid]["candidates"]:
            for aid in (c["context_artifact_id"], c["candidate_id"]):
                if aid in artifacts and aid not in owned:
                    owned.append(aid)
        contexts = sorted((a for a in owned if artifacts[a]["kind"] == "context"),
                          key=lambda a: artifacts[a]["created_at"])
        ordered = contexts + [a for a in owned if artifacts[a]["kind"] == "candidate"]
        pattern = re.compile("|".join(re.escape(x) for x in [rid, *ordered]))
        plans.append((run, ordered, pattern))

    for table in ("runs", "events", "candidates", "validations", "artifacts", "labels", "operations",
                  "loop_diagnoses"):
        (out / table).mkdir(parents=True, exist_ok=True)
    buffers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    segment = 0

    def flush() -> None:
        nonlocal segment
        segment += 1
        for table, rows in buffers.items():
            if rows:
                if table != "artifacts":
                    rows.sort(key=lambda r: r["run_id"])
                pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(table)),
                               out / table / f"seg-{segment:08d}.parquet", compression="zstd",
                               row_group_size=20_000)
        buffers.clear()

    written = 0
    buffers["artifacts"].extend(registries)
    for i in range(clones):
        for run, ordered, pattern in plans:
            old = run["run_id"]
            new_run = f"{old}.c{i:06d}"
            mapping = {old: new_run}

            def sub(text: str | None) -> str | None:
                return pattern.sub(lambda m: mapping[m.group()], text) if text else text

            for aid in ordered:
                art = artifacts[aid]
                body = sub(art["body"])
                if art["kind"] == "context":
                    body = body.replace('"memory":{}', f'"memory":{{"clone":"{new_run}"}}', 1)
                new_id = hashlib.sha256(body.encode()).hexdigest()
                mapping[aid] = new_id
                buffers["artifacts"].append({**art, "artifact_id": new_id, "run_id": new_run, "body": body,
                                             "size_bytes": len(body.encode())})
            buffers["runs"].append({**run, "run_id": new_run, "thread_id": new_run})
            for e in by_run[old]["events"]:
                buffers["events"].append({**e, "run_id": new_run, "payload_json": sub(e["payload_json"])})
            for c in by_run[old]["candidates"]:
                buffers["candidates"].append({**c, "run_id": new_run, "candidate_id": sub(c["candidate_id"]),
                                              "context_artifact_id": sub(c["context_artifact_id"]),
                                              "items_json": sub(c["items_json"])})
            for v in by_run[old]["validations"]:
                buffers["validations"].append({**v, "run_id": new_run, "candidate_id": sub(v["candidate_id"])})
            written += sum(1 for e in by_run[old]["events"] if e["to_state"] == "VALIDATING")
        if len(buffers["runs"]) >= SEGMENT_RUNS:
            flush()
    flush()
    for table in ("labels", "operations", "loop_diagnoses"):
        pq.write_table(pa.Table.from_pylist([], schema=arrow_schema(table)), out / table / "empty.parquet")
    if tmp is not None:
        tmp.cleanup()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--candidates", type=int, default=1_000_000)
    args = parser.parse_args()
    print(generate(args.out, args.candidates), "candidates written to", args.out)


if __name__ == "__main__":
    main()
