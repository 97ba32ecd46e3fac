"""The Parquet trace tables (CONTRACT.md, 'Parquet tables'), described once.

Each table lists its columns with a type and the SQL expression that reads
it from the journal. The recorder builds explicit pyarrow schemas from this
description; pyarrow itself is imported only when a schema is asked for, so
the command line starts fast.

Two kinds of table:

* **append** tables grow by segments: rows are selected by the export's
  per-run seq ranges (``_export_ranges``: run_id, lo, hi; read in run_id
  order), artifacts by the run and seq of the commit that stored them
  first, and ``labels``, which belong to no commit, by a label id range
  (the two ``?``); they never change once written;
* **snapshot** tables (``runs``, ``operations``) hold mutable records and
  are rewritten whole, atomically, by each export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # str | int | float | ts | bool
    sql: str | None = None  # expression over the journal row ``t``; default t.<name>
    doc: str = ""

    @property
    def expr(self) -> str:
        return self.sql or f"t.{self.name}"


@dataclass(frozen=True)
class TraceTable:
    name: str
    kind: str  # append | snapshot
    columns: tuple[Column, ...]
    source: str  # FROM/WHERE clause over the journal, aliasing the table as t
    order: str

    @property
    def bounded(self) -> bool:
        """Selected by a global sequence range rather than by per-run ranges."""
        return "?" in self.source

    def select_sql(self, join: str = "CROSS JOIN") -> str:
        """The query; ``join`` joins the export's ranges to the table (the
        store's ``driving_join``)."""
        cols = ", ".join(c.expr for c in self.columns)
        source = self.source.replace("{join}", join)
        return f"SELECT {cols} FROM {source} ORDER BY {self.order}"

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _c(name: str, kind: str = "str", sql: str | None = None, doc: str = "") -> Column:
    return Column(name, kind, sql, doc)


#: Rows of the export's per-run ranges. The ranges drive the join (SQLite's
#: CROSS JOIN keeps that order, and the tables sort by ``x.run_id``, the
#: ranges table's key): an export of a few runs seeks their rows instead of
#: scanning every row of a large journal, and a full export still needs no
#: sort. ``{join}`` is the store's word for such a join.
_BY_SEQ = "_export_ranges x {{join}} {table} t ON t.run_id = x.run_id AND t.seq > x.lo AND t.seq <= x.hi"

TABLES: dict[str, TraceTable] = {
    t.name: t
    for t in (
        TraceTable(
            "runs",
            "snapshot",
            (
                _c("run_id"),
                _c("thread_id"),
                _c("task_id"),
                _c("tenant"),
                _c("prompt_version"),
                _c("prompt_hash"),
                _c("model_route"),
                _c("status", sql="t.state", doc="the run's state; terminal once it ended"),
                _c("reason"),
                _c("started_at", "ts"),
                _c("ended_at", "ts"),
                _c("steps", "int", sql="t.step"),
                _c("model_attempts", "int"),
                _c("tool_calls", "int"),
                _c("tokens_in", "int"),
                _c("tokens_out", "int"),
                _c("cost_usd", "float"),
                _c("reward", "float"),
                _c("state_version", "int"),
                _c("last_seq", "int", doc="the newest event seq when the snapshot was taken"),
                _c("waiting_json"),
                _c("spec_json", sql="s.spec_json"),
                _c("schema_version", "int"),
            ),
            "runs t JOIN run_specs s ON s.run_id = t.run_id",
            "t.started_at, t.run_id",
        ),
        TraceTable(
            "events",
            "append",
            (
                _c("run_id"),
                _c("seq", "int"),
                _c("ts", "ts"),
                _c("kind"),
                _c("from_state"),
                _c("to_state"),
                _c("step", "int"),
                _c("attempt", "int"),
                _c("state_version", "int"),
                _c("payload_json"),
                _c("schema_version", "int"),
            ),
            _BY_SEQ.format(table="events"),
            "x.run_id, t.seq",
        ),
        TraceTable(
            "artifacts",
            "append",
            (
                _c("artifact_id"),
                _c("run_id", sql="t.first_run_id", doc="the run that stored it first"),
                _c("kind"),
                _c("created_at", "ts"),
                _c("size_bytes", "int"),
                _c("body"),
                _c("schema_version", "int"),
            ),
            # Not by artifact_seq: on PostgreSQL a transaction still open can
            # hold a lower number than one already committed, and a range
            # of numbers would pass over its artifacts for good.
            "_export_ranges x {join} artifacts t ON t.first_run_id = x.run_id"
            " AND t.first_seq > x.lo AND t.first_seq <= x.hi",
            "x.run_id, t.first_seq, t.artifact_seq",
        ),
        TraceTable(
            "candidates",
            "append",
            (
                _c("run_id"),
                _c("step", "int"),
                _c("attempt", "int"),
                _c("candidate_id"),
                _c("context_artifact_id"),
                _c("finish_reason"),
                _c("items_json"),
                _c("prompt_version"),
                _c("prompt_hash"),
                _c("model_route"),
                _c("tokens_in", "int"),
                _c("tokens_out", "int"),
                _c("cost_usd", "float"),
                _c("seq", "int"),
                _c("schema_version", "int"),
            ),
            _BY_SEQ.format(table="candidates"),
            "x.run_id, t.seq, t.step, t.attempt",
        ),
        TraceTable(
            "validations",
            "append",
            (
                _c("run_id"),
                _c("step", "int"),
                _c("attempt", "int"),
                _c("candidate_id"),
                _c("validator"),
                _c("validator_version"),
                _c("suite_version"),
                _c("verdict"),
                _c("code"),
                _c("message"),
                _c("evidence_json"),
                _c("seq", "int"),
                _c("schema_version", "int"),
            ),
            _BY_SEQ.format(table="validations"),
            "x.run_id, t.seq, t.rowid",
        ),
        TraceTable(
            "operations",
            "snapshot",
            (
                _c("operation_id"),
                _c("run_id"),
                _c("step", "int"),
                _c("call_id"),
                _c("tool"),
                _c("tool_version"),
                _c("idempotency_key"),
                _c("canonical_args_json"),
                _c("expected_resource_version"),
                _c("policy_decision"),
                _c("status"),
                _c("outcome"),
                _c("dispatch_count", "int"),
                _c("result_artifact_id"),
                _c("work_id"),
                _c("created_seq", "int"),
                _c("updated_seq", "int"),
                _c("schema_version", "int"),
            ),
            "operations t",
            "t.run_id, t.created_seq, t.operation_id",
        ),
        TraceTable(
            "loop_diagnoses",
            "append",
            (
                _c("run_id"),
                _c("step", "int"),
                _c("detector"),
                _c("detector_version"),
                _c("pattern"),
                _c("evidence_json"),
                _c("seq", "int"),
                _c("schema_version", "int"),
            ),
            _BY_SEQ.format(table="loop_diagnoses"),
            "x.run_id, t.seq, t.rowid",
        ),
        TraceTable(
            "labels",
            "append",
            (
                _c("label_id", "int"),
                _c("run_id"),
                _c("step", "int"),
                _c("attempt", "int"),
                _c("candidate_id"),
                _c("validator"),
                _c("expected_verdict"),
                _c("source"),
                _c("note"),
                _c("created_at", "ts"),
                _c("schema_version", "int"),
            ),
            "labels t WHERE t.label_id > ? AND t.label_id <= ?",
            "t.label_id",
        ),
    )
}


def arrow_type(kind: str) -> Any:
    import pyarrow as pa

    return {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "ts": pa.timestamp("us", tz="UTC"),
    }[kind]


def arrow_schema(table: str) -> Any:
    """The explicit pyarrow schema of a trace table."""
    import pyarrow as pa

    spec = TABLES[table]
    return pa.schema([pa.field(c.name, arrow_type(c.kind)) for c in spec.columns])


def arrow_batch(table: str, columns: Any) -> Any:
    """A record batch of ``table`` from its columns as Python sequences, in
    schema order (timestamps as microseconds since the epoch, as the
    journal keeps them).

    Each column is built by polars and handed over to Arrow without a copy
    of its values: ``pyarrow.array`` of a Python list first asks whether it
    is a pandas object, which imports pandas (a third of a second in every
    ``loopledger run``), and polars builds the same array two to three
    times faster."""
    import polars as pl
    import pyarrow as pa

    kinds = {"str": pl.Utf8, "int": pl.Int64, "float": pl.Float64, "bool": pl.Boolean, "ts": pl.Int64}
    schema = arrow_schema(table)
    arrays = [pl.Series(column.name, columns[index], kinds[column.kind], strict=True).to_arrow()
              .cast(schema.field(index).type)
              for index, column in enumerate(TABLES[table].columns)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
