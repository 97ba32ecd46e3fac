"""Loop detectors, batch form: polars expressions over a step table of many
runs (columns ``_steps.STEP_COLUMNS``), used by replay.

Each function mirrors its streaming class in ``_detectors``. The table is in
(run, step) order, so "within a run" is a row-boundary mask rather than a
per-run window (which would cost a hash partition per run):

* "consecutive" is gaps-and-islands: the index of the last break, carried
  forward, subtracted from the row index;
* "k steps back" is a shift by k, valid when that row is in the same run.

All detectors are lazy queries over one shared prepared table, collected
together so polars shares the preparation and runs them in parallel. Only
the (few) finding rows leave polars; their evidence JSON is written by the
same canonical form as the streaming findings: polars' JSON encoding of a
struct whose fields are in sorted order is byte-identical to
``canonical_json`` of the same dict (sorted keys, no whitespace, UTF-8
kept, the same escapes; the tests compare them over every code point), so
the findings are written, sorted and framed without a Python object per row.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import polars as pl

from ._detectors import BROKEN_BY_PROGRESS, DIAGNOSIS_COLUMNS, make_detector
from ._errors import InputError
from ._steps import OPEN, STEP_COLUMNS, step_schema

__all__ = ["detect_batch", "empty_diagnoses"]

_RUN = "run_id"
_IDX = pl.col("_idx")

# Rows with empty error lists are filtered out before exploding, so the
# empty-list behaviour does not matter; passing it explicitly (where this
# polars accepts it) keeps the future-default warning quiet.
_EXPLODE_KW = {"empty_as_null": True} if "empty_as_null" in inspect.signature(pl.LazyFrame.explode).parameters else {}

#: A detector's batch plan: lazy queries of its findings, each with the
#: columns run_id, step, pattern, evidence_json.
Plan = list[pl.LazyFrame]


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


def _prepare(steps: pl.DataFrame) -> pl.LazyFrame:
    missing = [c for c in STEP_COLUMNS if c not in steps.columns]
    if missing:
        raise InputError("steps", f"missing column(s) {', '.join(missing)}; expected {', '.join(STEP_COLUMNS)}")
    schema = step_schema()
    is_open = pl.col(OPEN).cast(pl.Boolean).fill_null(False) if OPEN in steps.columns else pl.lit(False)
    frame = steps.select([pl.col(c).cast(schema[c]) for c in STEP_COLUMNS] + [is_open.alias(OPEN)])
    ran = (pl.col("states").list.len() > 0) | (pl.col("errors").list.len() > 0) | (pl.col("new_evidence") != 0) | (
        pl.col("completed_operations") != 0) | pl.col("candidates").is_not_null()
    wrong = frame.select(pl.int_range(pl.len()).filter(pl.col(OPEN) & ran.fill_null(False)).first()).item()
    if wrong is not None:
        row = frame.row(wrong, named=True)
        raise InputError(f"steps[{wrong}]", f"an open step (open = true: run {row['run_id']} step {row['step']}) has "
                                            "calls only, nothing ran in it; expected no states, errors, progress or "
                                            "candidates")
    # Streaming sees each run's steps in step order; so must we. Tables
    # written by the recorder already are, and checking is much cheaper
    # than sorting a million rows again.
    prev_run, prev_step = pl.col(_RUN).shift(1), pl.col("step").shift(1)
    ordered = frame.select(
        ((pl.col(_RUN) > prev_run) | ((pl.col(_RUN) == prev_run) & (pl.col("step") > prev_step))).fill_null(True).all()
    ).item()
    if not ordered:
        frame = frame.sort([_RUN, "step"], maintain_order=True)
    return (
        frame.lazy()
        .with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("_idx"),
            (pl.col(_RUN) != pl.col(_RUN).shift(1)).fill_null(True).alias("_new_run"),
        )
        .with_columns(pl.when(pl.col("_new_run")).then(_IDX).forward_fill().alias("_run_start"))
    )


def _token(col: str) -> pl.Expr:
    """A step's token: its list joined with "|" (as streaming does), null when empty."""
    n = pl.col(col).list.len()
    # Most steps hold one call: take it as is, and join only when needed.
    return pl.when(n == 1).then(pl.col(col).list.first()).when(n > 1).then(pl.col(col).list.join("|"))


def _hashed_token(col: str) -> pl.Expr:
    """A step's token as a 64-bit hash of its list, null when empty. States
    lists have several entries on every step, and hashing them costs a
    fraction of joining them into strings; steps are only ever compared with
    a neighbour (one step or ``period`` steps back), where a 64-bit collision
    is out of reach. The strings of a finding's evidence are built from the
    lists themselves, for the few rows that hold one."""
    return pl.when(pl.col(col).list.len() > 0).then(pl.col(col).hash())


def _finding(pattern: str, **evidence: pl.Expr | Any) -> list[pl.Expr]:
    """A finding's pattern and evidence JSON, its fields in sorted order (the
    canonical form); a plain value is a literal."""
    fields = [(v if isinstance(v, pl.Expr) else pl.lit(v)).alias(k) for k, v in sorted(evidence.items())]
    return [pl.lit(pattern).alias("pattern"), pl.struct(fields).struct.json_encode().alias("evidence_json")]


def _same_as_previous(col: str) -> pl.Expr:
    # null (a step without a token) never equals anything, as in streaming.
    return ((pl.col(col) == pl.col(col).shift(1)) & ~pl.col("_new_run")).fill_null(False)


def _since(breaks: pl.Expr) -> pl.Expr:
    """Index of the last row (at or before this one) where ``breaks`` holds."""
    return pl.when(breaks).then(_IDX).forward_fill()


def _repeated_call(lf: pl.LazyFrame, threshold: int) -> Plan:
    run_len = _IDX - _since(~_same_as_previous("_calls")) + 1
    query = (
        lf.select(_RUN, "step", "_idx", "_new_run", _token("calls").alias("_calls"))
        .select(_RUN, "step", "_calls", run_len.alias("_n"), pl.col("step").shift(threshold - 1).alias("_first"))
        .filter(pl.col("_calls").is_not_null() & (pl.col("_n") == threshold))
        .select(_RUN, "step", *_finding("repeated_call", call=pl.col("_calls"), count=threshold, first_step=pl.col("_first")))
    )
    return [query]


def _repeated_error(lf: pl.LazyFrame, threshold: int) -> Plan:
    # Few steps carry errors: over just those (in run, step order), one
    # grouping by (run, code) gives each code's first step and the step of
    # its threshold-th occurrence (a third of the cost of two windows).
    query = (
        lf.select(_RUN, "step", pl.col("errors").alias("_code"))
        .filter(pl.col("_code").list.len() > 0)
        .explode("_code", **_EXPLODE_KW)
        .group_by([_RUN, "_code"], maintain_order=True)
        .agg(pl.col("step").slice(threshold - 1, 1).first().alias("step"), pl.col("step").first().alias("_first"))
        .filter(pl.col("step").is_not_null())
        .select(_RUN, "step", *_finding("repeated_error", code=pl.col("_code"), count=threshold, first_step=pl.col("_first")))
    )
    return [query]


def _no_progress(lf: pl.LazyFrame, window: int) -> Plan:
    # Open steps (a candidate's proposed calls, nothing ran) do not count,
    # as in streaming: over the finished steps only, `_k` numbers them and
    # the streak is `_k` since the last one with progress.
    done = ~pl.col(OPEN)
    # The last known candidate-set size before this step, within the run.
    last_with = _since(pl.col("candidates").is_not_null() & done).shift(1)
    prev_known = pl.when(last_with >= pl.col("_run_start")).then(pl.col("candidates").gather(last_with.fill_null(0)))
    progress = (
        (pl.col("new_evidence") > 0)
        | (pl.col("completed_operations") > 0)
        | (pl.col("candidates") < prev_known).fill_null(False)
    )
    k = pl.col("_k")
    # Finished steps without progress since the last one with progress, or
    # since the run began when there was none yet.
    base = (pl.when(pl.col("_p") & pl.col("_done")).then(k)
            .when(pl.col("_new_run")).then(k - pl.col("_done").cast(pl.Int64)).forward_fill())
    streak = pl.col("_done") & ~pl.col("_p")
    query = (
        lf.select(_RUN, "step", "_new_run", done.alias("_done"), progress.alias("_p"))
        .with_columns(pl.col("_done").cast(pl.Int64).cum_sum().alias("_k"))
        .with_columns((k - base).alias("_n"))
        .with_columns(pl.when(streak & (pl.col("_n") == 1)).then(pl.col("step")).forward_fill().alias("_first"))
        .filter(streak & (pl.col("_n") == window))
        .select(_RUN, "step", *_finding("no_progress", window=window, first_step=pl.col("_first")))
    )
    return [query]


def _oscillation(lf: pl.LazyFrame, period: int, cycles: int, channels: Iterable[str]) -> Plan:
    need = period * (cycles - 1)
    plan: Plan = []
    for channel in channels:
        tok = pl.col("_tok")
        match = ((tok == tok.shift(period)) & (_IDX - period >= pl.col("_run_start"))).fill_null(False)
        if channel in BROKEN_BY_PROGRESS:
            match = match & ~(pl.col("new_evidence") > 0)
        matches = _IDX - _since(~pl.col("_match"))  # consecutive k-back matches ending here
        same = _IDX - _since(~_same_as_previous("_tok")) + 1  # identical tokens ending here
        holds = (matches >= need) & (same < period)
        was = (pl.col("_holds").shift(1) & ~pl.col("_new_run")).fill_null(False)
        # The cycle is the last `period` tokens; a holding row has at least
        # `period` matches behind it, so they all belong to its run.
        hashed = channel == "states"
        token = _hashed_token(channel) if hashed else _token(channel)
        source = pl.col(channel) if hashed else tok
        cycle = [source.shift(period - 1 - j).alias(f"_c{j}") for j in range(period)]
        parts = [pl.col(f"_c{j}").list.join("|") if hashed else pl.col(f"_c{j}") for j in range(period)]
        query = (
            lf.select(_RUN, "step", "_idx", "_new_run", "_run_start", "new_evidence", channel, token.alias("_tok"))
            .with_columns(match.alias("_match"))
            .with_columns(holds.alias("_holds"))
            .with_columns(was.alias("_was"), *cycle)
            .filter(pl.col("_holds") & ~pl.col("_was"))
            .select(_RUN, "step", *_finding(f"oscillation_{channel}", channel=channel, period=period, cycles=cycles,
                                            cycle=pl.concat_list(parts)))
        )
        plan.append(query)
    return plan


_BATCH: dict[str, Callable[[pl.LazyFrame, dict[str, Any]], Plan]] = {
    "loop.repeated_call": lambda lf, p: _repeated_call(lf, p["threshold"]),
    "loop.repeated_error": lambda lf, p: _repeated_error(lf, p["threshold"]),
    "loop.no_progress": lambda lf, p: _no_progress(lf, p["window"]),
    "loop.oscillation": lambda lf, p: _oscillation(lf, p["period"], p["cycles"], p["channels"]),
}


def _checked(steps: Any, detectors: Any) -> list[tuple[str, Any]]:
    """``detect_batch``'s arguments checked: the steps a polars frame, each
    detector a ``(name, params)`` pair made into its detector (which checks
    the name and the params)."""
    if not isinstance(steps, pl.DataFrame):
        raise InputError("steps", f"expected a polars DataFrame with the StepRecord columns (steps_frame(records) "
                                  f"builds one), got {type(steps).__name__}")
    if not isinstance(detectors, Iterable) or isinstance(detectors, (str, bytes, Mapping)):
        raise InputError("detectors", f"expected a list of (name, params) pairs, got {type(detectors).__name__}")
    specs = []
    for i, pair in enumerate(detectors):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)
                and (pair[1] is None or isinstance(pair[1], Mapping))):
            raise InputError(f"detectors[{i}]", f"expected a (name, params) pair, got {reprlib.repr(pair)}")
        specs.append((pair[0], make_detector(*pair)))
    return specs


def detect_batch(steps: pl.DataFrame, detectors: Iterable[tuple[str, Mapping[str, Any]]]) -> pl.DataFrame:
    """Findings of every detector over a step table of many runs, as a
    ``loop_diagnoses`` frame sorted by run, step, detector, pattern.
    Arguments of the wrong shape are :class:`InputError`, unknown detectors
    or params :class:`ParamError`, before any work."""
    specs = _checked(steps, detectors)
    if steps.height == 0 or not specs:
        return empty_diagnoses()
    # Shared by every query: collect_all evaluates the cached plan once.
    lf = _prepare(steps).cache()
    schema = empty_diagnoses().schema
    queries = [
        query.select(_RUN, "step", pl.lit(name).alias("detector"), pl.lit(det.version).alias("detector_version"),
                     "pattern", "evidence_json").cast(schema)
        for name, det in specs
        for query in _BATCH[name](lf, det.params)
    ]
    # One plan: the queries run in parallel over the cached table, and their
    # few finding rows are sorted as one frame.
    return pl.concat(queries).sort(DIAGNOSIS_COLUMNS).collect().select(DIAGNOSIS_COLUMNS)
