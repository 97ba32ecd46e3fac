"""Loop detectors, batch form: one pass of polars expressions over a step
table of many runs (see ``_steps.STEP_SCHEMA``), used by replay.

Each function mirrors its streaming class in ``_detectors`` with
window expressions partitioned by run: "consecutive" is a gaps-and-islands
grouping (a cumulative sum of breaks), "k steps back" a shift within the run.
Only the (few) finding rows leave polars; their evidence JSON is written by
the same canonical serialiser as the streaming findings, so the two forms
give byte-identical ``evidence_json``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from loopledger.canonical import canonical_json

from ._detectors import DIAGNOSIS_COLUMNS, make_detector
from ._errors import InputError
from ._steps import STEP_COLUMNS, step_schema

__all__ = ["detect_batch", "empty_diagnoses"]

_RUN = "run_id"

# Rows with empty error lists are filtered out before exploding, so the
# empty-list behaviour does not matter; passing it explicitly (where this
# polars accepts it) keeps the future-default warning quiet.
_EXPLODE_KW = {"empty_as_null": True} if "empty_as_null" in inspect.signature(pl.LazyFrame.explode).parameters else {}


def empty_diagnoses() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            "run_id": pl.Utf8,
            "step": pl.Int64,
            "detector": pl.Utf8,
            "detector_version": pl.Utf8,
            "pattern": pl.Utf8,
            "evidence_json": pl.Utf8,
        }
    )


def _prepare(steps: pl.DataFrame) -> pl.DataFrame:
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise InputError("steps", f"missing column(s) {', '.join(missing)}; expected {', '.join(STEP_COLUMNS)}")
    schema = step_schema()
    frame = steps.select([pl.col(c).cast(schema[c]) for c in STEP_COLUMNS])
    # Streaming sees each run's steps in step order; so must we.
    frame = frame.sort([_RUN, "step"], maintain_order=True)
    return frame.with_columns(
        pl.when(pl.col("calls").list.len() > 0).then(pl.col("calls").list.join("|")).alias("_calls"),
        pl.when(pl.col("states").list.len() > 0).then(pl.col("states").list.join("|")).alias("_states"),
    )


def _same_as_previous(col: str) -> pl.Expr:
    # null (a step without a token) never equals anything, as in streaming.
    return (pl.col(col) == pl.col(col).shift(1)).over(_RUN).fill_null(False)


def _repeated_call(frame: pl.DataFrame, threshold: int) -> list[tuple[str, int, str, dict[str, Any]]]:
    hits = (
        frame.lazy()
        .select(_RUN, "step", "_calls")
        .with_columns(_same_as_previous("_calls").alias("_eq"))
        .with_columns((~pl.col("_eq")).cum_sum().over(_RUN).alias("_grp"))
        .with_columns(
            (pl.int_range(pl.len()).over([_RUN, "_grp"]) + 1).alias("_n"),
            pl.col("step").first().over([_RUN, "_grp"]).alias("_first"),
        )
        .filter(pl.col("_calls").is_not_null() & (pl.col("_n") == threshold))
        .select(_RUN, "step", "_calls", "_first")
        .collect()
    )
    return [
        (run, step, "repeated_call", {"call": call, "count": threshold, "first_step": first})
        for run, step, call, first in hits.iter_rows()
    ]


def _repeated_error(frame: pl.DataFrame, threshold: int) -> list[tuple[str, int, str, dict[str, Any]]]:
    hits = (
        frame.lazy()
        .select(_RUN, "step", pl.col("errors").alias("_code"))
        .filter(pl.col("_code").list.len() > 0)
        .explode("_code", **_EXPLODE_KW)
        .with_columns(
            (pl.int_range(pl.len()).over([_RUN, "_code"]) + 1).alias("_n"),
            pl.col("step").first().over([_RUN, "_code"]).alias("_first"),
        )
        .filter(pl.col("_n") == threshold)
        .select(_RUN, "step", "_code", "_first")
        .collect()
    )
    return [
        (run, step, "repeated_error", {"code": code, "count": threshold, "first_step": first})
        for run, step, code, first in hits.iter_rows()
    ]


def _no_progress(frame: pl.DataFrame, window: int) -> list[tuple[str, int, str, dict[str, Any]]]:
    last_known = pl.col("candidates").forward_fill().shift(1).over(_RUN)
    progress = (
        (pl.col("new_evidence") > 0)
        | (pl.col("completed_operations") > 0)
        | (pl.col("candidates") < last_known).fill_null(False)
    )
    hits = (
        frame.lazy()
        .select(_RUN, "step", "new_evidence", "completed_operations", "candidates")
        .with_columns(progress.alias("_p"))
        .with_columns(pl.col("_p").cum_sum().over(_RUN).alias("_grp"))
        .with_columns(
            (~pl.col("_p")).cum_sum().over([_RUN, "_grp"]).alias("_n"),
            pl.when(~pl.col("_p")).then(pl.col("step")).min().over([_RUN, "_grp"]).alias("_first"),
        )
        .filter(~pl.col("_p") & (pl.col("_n") == window))
        .select(_RUN, "step", "_first")
        .collect()
    )
    return [(run, step, "no_progress", {"window": window, "first_step": first}) for run, step, first in hits.iter_rows()]


def _oscillation(
    frame: pl.DataFrame, period: int, cycles: int, channels: Iterable[str]
) -> list[tuple[str, int, str, dict[str, Any]]]:
    out: list[tuple[str, int, str, dict[str, Any]]] = []
    need = period * (cycles - 1)
    for channel in channels:
        tok = f"_{channel}"
        match = (pl.col(tok) == pl.col(tok).shift(period)).over(_RUN).fill_null(False)
        holds = (pl.col("_m") >= need) & (pl.col("_same") < period)
        hits = (
            frame.lazy()
            .select(_RUN, "step", tok)
            .with_columns(match.alias("_match"), _same_as_previous(tok).alias("_eq"))
            .with_columns(
                (~pl.col("_match")).cum_sum().over(_RUN).alias("_g1"),
                (~pl.col("_eq")).cum_sum().over(_RUN).alias("_g2"),
            )
            .with_columns(
                pl.col("_match").cast(pl.Int64).cum_sum().over([_RUN, "_g1"]).alias("_m"),
                (pl.col("_eq").cast(pl.Int64).cum_sum().over([_RUN, "_g2"]) + 1).alias("_same"),
            )
            .with_columns(holds.alias("_holds"))
            .with_columns(pl.col("_holds").shift(1).over(_RUN).fill_null(False).alias("_was"))
            .with_columns(
                pl.concat_list([pl.col(tok).shift(period - 1 - j).over(_RUN) for j in range(period)]).alias("_cycle")
            )
            .filter(pl.col("_holds") & ~pl.col("_was"))
            .select(_RUN, "step", "_cycle")
            .collect()
        )
        out.extend(
            (
                run,
                step,
                f"oscillation_{channel}",
                {"channel": channel, "period": period, "cycles": cycles, "cycle": list(cycle)},
            )
            for run, step, cycle in hits.iter_rows()
        )
    return out


_BATCH = {
    "loop.repeated_call": lambda f, p: _repeated_call(f, p["threshold"]),
    "loop.repeated_error": lambda f, p: _repeated_error(f, p["threshold"]),
    "loop.no_progress": lambda f, p: _no_progress(f, p["window"]),
    "loop.oscillation": lambda f, p: _oscillation(f, p["period"], p["cycles"], p["channels"]),
}


def detect_batch(steps: pl.DataFrame, detectors: Iterable[tuple[str, Mapping[str, Any]]]) -> pl.DataFrame:
    """Findings of every detector over a step table of many runs, as a
    ``loop_diagnoses`` frame sorted by run, step, detector, pattern."""
    specs = [(name, make_detector(name, params)) for name, params in detectors]  # validates params
    if steps.height == 0 or not specs:
        return empty_diagnoses()
    frame = _prepare(steps)
    rows: list[tuple[str, int, str, str, str, str]] = []
    for name, det in specs:
        for run, step, pattern, evidence in _BATCH[name](frame, det.params):
            rows.append((run, step, name, det.version, pattern, canonical_json(evidence)))
    if not rows:
        return empty_diagnoses()
    rows.sort()
    return pl.DataFrame(rows, schema=empty_diagnoses().schema, orient="row").select(DIAGNOSIS_COLUMNS)
