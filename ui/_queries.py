"""The data behind the Overview, Runs, Run, Loop diagnoses and Compare
prompt versions pages: plain functions of a :class:`~._data.Traces`.

Each returns small, already aggregated results (dicts of numbers, frames of
at most a page of rows), so Streamlit can cache them and the benchmark can
time them without a browser.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Sequence
from typing import Any

from ._data import RECORDED, TERMINAL_STATES, WAITING_STATES, CorruptData, NoData, Traces
from ._stats import wilson

LOOP_REASONS = ("loop_detected", "no_progress")

#: The name of a missing value in the Overview's charts and the Runs page's
#: filter (a run without a reason: one still under way, or whose process died).
NO_REASON = "(none)"

# A run "looped" when a detector stopped it or left a finding: both the
# reason and the diagnoses table count, because imported traces may carry
# only one of them.
_FLAGGED_RUNS = """
    WITH looped AS (SELECT DISTINCT run_id FROM loop_diagnoses),
    flagged AS (
        SELECT r.*,
               (r.reason IN ('loop_detected', 'no_progress') OR l.run_id IS NOT NULL) AS looped,
               r.status IN $terminal AS finished
        FROM runs r LEFT JOIN looped l ON l.run_id = r.run_id
    )
"""


def _terminal() -> dict[str, Any]:
    return {"terminal": list(TERMINAL_STATES)}


def _num(value: Any) -> float:
    """None and NaN (empty aggregates) read as 0 on the page."""
    if value is None:
        return 0.0
    value = float(value)
    return 0.0 if math.isnan(value) else value


# -- Overview -------------------------------------------------------------------


def _tokens(alias: str = "") -> str:
    """A run's tokens in and out, in SQL: null only when it reports neither
    (an imported run whose source gives no usage); one it does not report
    counts as 0 beside the other."""
    i, o = f"{alias}tokens_in", f"{alias}tokens_out"
    return f"CASE WHEN {i} IS NULL AND {o} IS NULL THEN NULL ELSE coalesce({i}, 0) + coalesce({o}, 0) END"


def unreadable_tables(t: Traces) -> dict[str, str]:
    """Secondary tables left empty because a file of theirs cannot be read,
    and what to tell (``Traces.unreadable_tables``)."""
    t.con  # noqa: B018 - opening the connection finds them
    return dict(t.unreadable_tables)


def overview(t: Traces) -> dict[str, Any]:
    """Headline numbers and the breakdowns of the Overview page."""
    t.require("runs")
    row = t.one(
        _FLAGGED_RUNS + """
        SELECT count(*), count(*) FILTER (finished),
               count(*) FILTER (status = 'SUCCEEDED'),
               count(*) FILTER (finished AND looped),
               count(*) FILTER (status = 'BUDGET_EXHAUSTED'),
               avg(steps), sum(tokens_in), sum(tokens_out), sum(cost_usd), avg(cost_usd),
               sum(model_attempts), sum(tool_calls),
               count(reward), count(*) FILTER (reward >= 1), avg(reward),
               count(""" + _tokens() + """), count(cost_usd)
        FROM flagged
        """,
        _terminal(),
    )
    runs, finished, succeeded, looped, budget = (int(v or 0) for v in row[:5])
    totals = {
        "runs": runs,
        "finished": finished,
        "succeeded": succeeded,
        "looped": looped,
        "budget_stopped": budget,
        "success_rate": succeeded / finished if finished else 0.0,
        "loop_rate": looped / finished if finished else 0.0,
        "budget_rate": budget / finished if finished else 0.0,
        "mean_steps": _num(row[5]),
        "tokens_in": int(_num(row[6])),
        "tokens_out": int(_num(row[7])),
        "cost_usd": _num(row[8]),
        "mean_cost_usd": _num(row[9]),
        "model_attempts": int(_num(row[10])),
        "tool_calls": int(_num(row[11])),
        # Imported runs carry their source's score of the task: their status
        # only says how the conversation ended (docs/importers.md).
        "rewarded": int(row[12] or 0),
        "reward_solved": int(row[13] or 0),
        "reward_rate": (row[13] or 0) / row[12] if row[12] else 0.0,
        "mean_reward": _num(row[14]),
        # Imported runs whose source gives no usage hold null tokens and cost:
        # the sums and the mean are over the runs that report them.
        "runs_with_tokens": int(row[15] or 0),
        "runs_with_cost": int(row[16] or 0),
    }
    groups = t.df(
        """
        SELECT CASE WHEN grouping(status) = 0 THEN 'status'
                    WHEN grouping(reason) = 0 THEN 'reason'
                    WHEN grouping(prompt_version) = 0 THEN 'prompt_version'
                    ELSE 'model_route' END AS dimension,
               coalesce(status, reason, prompt_version, model_route, $none) AS value,
               count(*) AS runs
        FROM runs
        GROUP BY GROUPING SETS ((status), (reason), (prompt_version), (model_route))
        ORDER BY dimension, runs DESC, value
        """,
        {"none": NO_REASON},
    )
    by_version = t.df(
        f"""
        SELECT prompt_version, model_route, status, count(*) AS runs,
               round(avg(steps), 2) AS mean_steps, sum({_tokens()}) AS tokens,
               round(sum(cost_usd), 6) AS cost_usd
        FROM runs GROUP BY ALL ORDER BY prompt_version, model_route, status
        """
    )
    return {
        "totals": totals,
        "breakdowns": {dim: frame.drop(columns="dimension").reset_index(drop=True)
                       for dim, frame in groups.groupby("dimension", sort=True)},
        "by_version": by_version,
    }


def time_split(t: Traces) -> Any:
    """Seconds spent queued, waiting (WAITING_USER, WAITING_TOOL) and
    processing (every other state) per prompt version. A state span runs
    from the transition into it to the run's next transition; a run's
    current, still open span is not counted. Queued is a run's first span,
    from its creation until an engine took it up (as ``show`` reports it).

    Written without a window over all transitions (sorting millions of
    events per run is what made this slow): a run's closed spans cover its
    first to its last transition, and each wait ends with the transition
    *from* that waiting state, so the k-th entry into waiting pairs with the
    k-th exit; only those few events are numbered.
    """
    return t.df(
        """
        WITH moves AS (
            SELECT run_id, seq, epoch_us(ts) AS us, from_state, to_state FROM events WHERE to_state IS NOT NULL
        ),
        span AS (
            SELECT run_id, max(us) - min(us) AS total_us,
                   coalesce(min(us) FILTER (WHERE from_state IS NOT NULL)
                            - min(us) FILTER (WHERE from_state IS NULL), 0) AS queued_us
            FROM moves GROUP BY run_id
        ),
        entries AS (
            SELECT run_id, us, row_number() OVER (PARTITION BY run_id ORDER BY seq) AS k
            FROM moves WHERE to_state IN $waiting
        ),
        exits AS (
            SELECT run_id, us, row_number() OVER (PARTITION BY run_id ORDER BY seq) AS k
            FROM moves WHERE from_state IN $waiting
        ),
        waited AS (
            SELECT x.run_id, sum(x.us - e.us) AS waiting_us
            FROM exits x JOIN entries e ON e.run_id = x.run_id AND e.k = x.k GROUP BY x.run_id
        )
        SELECT r.prompt_version, count(*) AS runs,
               sum(s.total_us - s.queued_us - coalesce(w.waiting_us, 0)) / 1e6 AS processing_s,
               coalesce(sum(w.waiting_us), 0) / 1e6 AS waiting_s,
               sum(s.queued_us) / 1e6 AS queued_s
        FROM span s JOIN runs r ON r.run_id = s.run_id LEFT JOIN waited w ON w.run_id = s.run_id
        GROUP BY r.prompt_version ORDER BY r.prompt_version
        """,
        {"waiting": list(WAITING_STATES)},
    )


# -- Runs -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunFilter:
    """What the Runs page filters on; empty means "any"."""

    statuses: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    prompt_versions: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    detectors: tuple[str, ...] = ()
    task: str = ""  # substring of task_id, case-insensitive
    started_from: datetime | None = None
    started_to: datetime | None = None  # exclusive


SORTABLE = ("started_at", "ended_at", "run_id", "task_id", "tenant", "prompt_version", "status", "reason",
            "reward", "steps", "tool_calls", "tokens", "cost_usd", "duration_s")


def run_filter_options(t: Traces) -> dict[str, Any]:
    """The values each filter of the Runs page offers."""
    t.require("runs")
    options = {
        name: [v for (v,) in t.rows(f"SELECT DISTINCT {name} FROM runs WHERE {name} IS NOT NULL ORDER BY 1")]
        for name in ("status", "reason", "prompt_version", "tenant")
    }
    (unreasoned,) = t.one("SELECT count(*) FROM runs WHERE reason IS NULL")
    if unreasoned:
        options["reason"].append(NO_REASON)
    options["detector"] = [v for (v,) in t.rows("SELECT DISTINCT detector FROM loop_diagnoses ORDER BY 1")]
    lo, hi = t.one("SELECT min(started_at), max(started_at) FROM runs")
    options["started"] = (lo, hi)
    return options


def _run_where(f: RunFilter) -> tuple[str, dict[str, Any]]:
    clauses, params = [], {}
    for column, values in (("status", f.statuses), ("reason", f.reasons),
                           ("prompt_version", f.prompt_versions), ("tenant", f.tenants)):
        if values:
            unreasoned = column == "reason" and NO_REASON in values
            clauses.append("(r.reason IN $reason OR r.reason IS NULL)" if unreasoned else f"r.{column} IN ${column}")
            params[column] = list(values)
    if f.detectors:
        clauses.append("r.run_id IN (SELECT run_id FROM loop_diagnoses WHERE detector IN $detectors)")
        params["detectors"] = list(f.detectors)
    if f.task:
        clauses.append("contains(lower(r.task_id), $task)")
        params["task"] = f.task.lower()
    if f.started_from is not None:
        clauses.append("r.started_at >= $started_from")
        params["started_from"] = f.started_from
    if f.started_to is not None:
        clauses.append("r.started_at < $started_to")
        params["started_to"] = f.started_to
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def runs_count(t: Traces, f: RunFilter) -> int:
    t.require("runs")
    where, params = _run_where(f)
    (total,) = t.one(f"SELECT count(*) FROM runs r {where}", params)
    return int(total)


def runs_page(t: Traces, f: RunFilter, sort: str = "started_at", descending: bool = True,
              offset: int = 0, limit: int = 50) -> tuple[int, Any]:
    """(number of matching runs, one page of them with their detectors)."""
    t.require("runs")
    if sort not in SORTABLE:
        raise ValueError(f"cannot sort by {sort!r}")
    total = runs_count(t, f)
    where, params = _run_where(f)
    order = f"{sort} {'DESC' if descending else 'ASC'} NULLS LAST, run_id"
    page = t.df(
        f"""
        WITH page AS (
            SELECT r.run_id, r.task_id, r.tenant, r.prompt_version, r.model_route, r.status, r.reason,
                   r.reward, r.steps, r.tool_calls, {_tokens('r.')} AS tokens, r.cost_usd,
                   r.started_at, r.ended_at,
                   date_diff('microsecond', r.started_at, r.ended_at) / 1e6 AS duration_s
            FROM runs r {where}
            ORDER BY {order} LIMIT $limit OFFSET $offset
        )
        SELECT page.*, d.detectors FROM page
        LEFT JOIN (SELECT run_id, string_agg(DISTINCT detector, ', ' ORDER BY detector) AS detectors
                   FROM loop_diagnoses WHERE run_id IN (SELECT run_id FROM page) GROUP BY run_id) d
               ON d.run_id = page.run_id
        ORDER BY {order}
        """,
        {**params, "limit": int(limit), "offset": int(offset)},
    )
    return int(total), page


# -- Run --------------------------------------------------------------------------


def run_detail(t: Traces, run_id: str) -> dict[str, Any] | None:
    """Everything the Run page shows about one run, or None if it is unknown."""
    t.require("runs")
    header = t.df(f"SELECT *, {_tokens()} AS tokens FROM runs WHERE run_id = $r", {"r": run_id})
    if header.empty:
        return None
    p = {"r": run_id}
    # Each section on its own: a table that cannot be read fails its own
    # section (named in ``errors``), not the page.
    errors: dict[str, str] = {}

    def section(name: str, sql: str, params: dict[str, Any] = p, columns: Sequence[str] = ()) -> Any:
        try:
            return t.df(sql, params)
        except CorruptData as exc:
            errors[name] = str(exc)
            import pandas as pd

            return pd.DataFrame(columns=list(columns))

    event_columns = ("seq", "ts", "kind", "from_state", "to_state", "step", "attempt", "payload_json")
    events = section("events", f"SELECT {', '.join(event_columns)} FROM events WHERE run_id = $r ORDER BY seq",
                     columns=event_columns)

    candidates = section("candidates", "SELECT step, attempt, candidate_id, context_artifact_id, finish_reason, "
                         "items_json, prompt_version, model_route FROM candidates WHERE run_id = $r "
                         "ORDER BY step, attempt")
    context_ids = [c for c in candidates.get("context_artifact_id", ()) if c is not None]
    return {
        "run": header.iloc[0].to_dict(),
        "events": events,
        "spans": state_spans(events, header.iloc[0]["ended_at"]),
        "candidates": candidates,
        "contexts": section("candidates", "SELECT artifact_id, kind, size_bytes FROM artifacts "
                            "WHERE artifact_id IN $ids", {"ids": list(dict.fromkeys(context_ids)) or [""]}),
        "validations": section("validations", "SELECT step, attempt, candidate_id, validator, validator_version, "
                               "suite_version, verdict, code, message, evidence_json FROM validations "
                               "WHERE run_id = $r ORDER BY step, attempt, seq"),
        "operations": section("operations", "SELECT operation_id, step, call_id, tool, tool_version, "
                              "idempotency_key, canonical_args_json, policy_decision, status, outcome, "
                              "dispatch_count, result_artifact_id, work_id FROM operations WHERE run_id = $r "
                              "ORDER BY created_seq"),
        "diagnoses": section("diagnoses", "SELECT step, detector, detector_version, pattern, evidence_json "
                             "FROM loop_diagnoses WHERE run_id = $r ORDER BY seq"),
        "labels": section("labels", "SELECT step, attempt, candidate_id, validator, expected_verdict, source, note, "
                          "created_at FROM all_labels WHERE run_id = $r "
                          "ORDER BY created_at NULLS FIRST, step, attempt"),
        "errors": errors,
    }


def state_spans(events: Any, ended_at: Any) -> Any:
    """The run's states as spans (state, start, end, step, attempt) for the
    Gantt chart: one span per transition, ending at the next one. The final
    terminal state is drawn as a point at the run's end. ``queued``: the
    span from the run's creation until an engine took it up."""
    import pandas as pd

    moves = events[events["to_state"].notna()].reset_index(drop=True)
    if moves.empty:
        return pd.DataFrame(columns=["state", "start", "end", "step", "attempt", "seconds", "waiting", "queued"])
    end = moves["ts"].shift(-1)
    last = moves["ts"].iloc[-1] if pd.isna(ended_at) else ended_at
    end.iloc[-1] = last
    spans = pd.DataFrame({
        "state": moves["to_state"], "start": moves["ts"], "end": end,
        "step": moves["step"], "attempt": moves["attempt"],
    })
    spans["seconds"] = (spans["end"] - spans["start"]).dt.total_seconds()
    spans["waiting"] = spans["state"].isin(WAITING_STATES)
    spans["queued"] = moves["from_state"].isna()
    return spans


def artifact_body(t: Traces, artifact_id: str) -> str | None:
    """One artifact's stored body (canonical JSON), read only when asked for."""
    rows = t.rows("SELECT body FROM artifacts WHERE artifact_id = $a LIMIT 1", {"a": artifact_id})
    return rows[0][0] if rows else None


def reconciliation(events: Any) -> Any:
    """The run's events about operations after dispatch: unknown outcomes,
    refusals (rate limits), background completions and replies."""
    kinds = ("dispatch_unknown", "dispatch_refused", "work_completed", "reply_accepted", "late_event")
    picked = events[events["kind"].isin(kinds)].copy()
    picked["detail"] = [_short_payload(p) for p in picked["payload_json"]]
    return picked[["seq", "ts", "kind", "step", "detail"]].reset_index(drop=True)


def waits(events: Any) -> Any:
    """Transitions into and out of a waiting state, with what was waited on."""
    touches_wait = events["to_state"].isin(WAITING_STATES) | events["from_state"].isin(WAITING_STATES)
    moves = events[touches_wait & events["to_state"].notna()].copy()
    moves["detail"] = [_short_payload(p) for p in moves["payload_json"]]
    return moves[["seq", "ts", "from_state", "to_state", "step", "detail"]].reset_index(drop=True)


def _short_payload(payload: Any, limit: int = 240) -> str:
    if not isinstance(payload, str):
        return ""
    try:
        data = json.loads(payload)
    except ValueError:
        return payload[:limit]
    if isinstance(data, dict):
        data.pop("summary", None)  # tool result bodies: shown with the operation, not here
    text = json.dumps(data, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- Loop diagnoses ------------------------------------------------------------------

def diagnosis_sources(t: Traces) -> list[str]:
    """Whose findings can be shown: the detectors' while the runs ran, then
    every readable replay's (its batch detectors over the same steps, with
    the replayed suite's parameters)."""
    found = [RECORDED] if t.has("loop_diagnoses") else []
    return found + [rid for rid in t.readable_replay_ids() if t.replay_has(rid, "loop_diagnoses")]


def _findings(t: Traces, source: str) -> tuple[str, dict[str, Any]]:
    """The findings of one source, as a FROM item (aliased ``d``) and its parameters."""
    if source == RECORDED:
        t.require("loop_diagnoses")
        return "loop_diagnoses d", {}
    if source not in t.replay_ids() or not t.replay_has(source, "loop_diagnoses"):
        raise NoData(f"No replay `{source}` with loop diagnoses under {t.replays_dir}.")
    t.require_replay(source)  # one that cannot be read: the file named
    return "(SELECT * FROM replay_loop_diagnoses WHERE replay_dir = $source) d", {"source": source}


def diagnoses_summary(t: Traces, source: str = RECORDED) -> Any:
    """Findings by detector and pattern, with how many of their runs failed."""
    found, params = _findings(t, source)
    return t.df(
        f"""
        SELECT d.detector, d.detector_version, d.pattern, count(*) AS findings, count(DISTINCT d.run_id) AS runs,
               count(DISTINCT d.run_id) FILTER (r.status IN $terminal AND r.status <> 'SUCCEEDED') AS runs_failed,
               count(DISTINCT d.run_id) FILTER (r.status = 'SUCCEEDED') AS runs_succeeded,
               min(d.step) AS first_step, max(d.step) AS last_step
        FROM {found} LEFT JOIN runs r ON r.run_id = d.run_id
        GROUP BY d.detector, d.detector_version, d.pattern
        ORDER BY findings DESC, d.detector, d.detector_version, d.pattern
        """,
        {**_terminal(), **params},
    )


def diagnoses_by_step(t: Traces, source: str = RECORDED) -> Any:
    """At which step detectors fire (a chart: late detection costs steps)."""
    found, params = _findings(t, source)
    return t.df(f"SELECT d.detector, d.step, count(*) AS findings FROM {found} GROUP BY ALL ORDER BY d.step", params)


def diagnoses_totals(t: Traces, source: str = RECORDED) -> dict[str, int]:
    """Runs with at least one finding, and how many of them failed."""
    found, params = _findings(t, source)
    runs, failed, known = t.one(
        "SELECT count(*), count(*) FILTER (r.status IN $terminal AND r.status <> 'SUCCEEDED'), count(r.run_id) "
        f"FROM (SELECT DISTINCT d.run_id FROM {found}) d LEFT JOIN runs r ON r.run_id = d.run_id",
        {**_terminal(), **params},
    )
    # ``known``: the runs whose outcome these traces hold (a replay copied
    # without its traces holds none).
    return {"runs": int(runs), "runs_failed": int(failed), "runs_known": int(known)}


def recorded_suites(t: Traces, with_findings: bool = False) -> list[str]:
    """The suite versions the recorded decisions were made under (more than
    one: runs recorded under different suites, whose figures pool them);
    ``with_findings``: of the runs with a recorded loop diagnosis only."""
    if not t.has("validations"):
        return []
    only = " AND run_id IN (SELECT run_id FROM loop_diagnoses)" if with_findings else ""
    return [v for (v,) in t.rows("SELECT DISTINCT suite_version FROM validations WHERE suite_version IS NOT NULL"
                                 f"{only} ORDER BY 1")]


def _finding_where(detector: str | None, pattern: str | None) -> tuple[str, dict[str, Any]]:
    where, params = [], {}
    if detector:
        where.append("d.detector = $detector")
        params["detector"] = detector
    if pattern:
        where.append("d.pattern = $pattern")
        params["pattern"] = pattern
    return ("WHERE " + " AND ".join(where)) if where else "", params


def diagnosis_count(t: Traces, detector: str | None, pattern: str | None, source: str = RECORDED) -> int:
    found, params = _findings(t, source)
    clause, more = _finding_where(detector, pattern)
    (total,) = t.one(f"SELECT count(*) FROM {found} {clause}", {**params, **more})
    return int(total)


def diagnosis_findings(t: Traces, detector: str | None, pattern: str | None,
                       offset: int = 0, limit: int = 50, source: str = RECORDED) -> tuple[int, Any]:
    """The drill-down: one page of findings with their runs' outcome."""
    total = diagnosis_count(t, detector, pattern, source)
    found, params = _findings(t, source)
    clause, more = _finding_where(detector, pattern)
    page = t.df(
        f"""
        SELECT d.run_id, d.step, d.detector, d.detector_version, d.pattern, r.task_id, r.prompt_version, r.status,
               r.reason, d.evidence_json
        FROM {found} LEFT JOIN runs r ON r.run_id = d.run_id {clause}
        ORDER BY d.run_id, d.step, d.detector LIMIT $limit OFFSET $offset
        """,
        {**params, **more, "limit": int(limit), "offset": int(offset)},
    )
    return int(total), page


# -- Compare prompt versions ----------------------------------------------------------


def prompt_versions(t: Traces) -> list[str]:
    t.require("runs")
    return [v for (v,) in t.rows("SELECT DISTINCT prompt_version FROM runs WHERE prompt_version IS NOT NULL "
                                 "ORDER BY 1")]


RATES = ("success", "loop", "budget_stop")
#: A run's outcome where its source scored it (an imported run's reward,
#: solved at 1), else its status: an imported run's status only says how its
#: conversation ended (docs/importers.md).
SOLVED = "coalesce(reward >= 1, status = 'SUCCEEDED')"


#: Tasks listed on Compare prompt versions (the most different first).
TASK_ROWS = 200


def prompt_compare(t: Traces, a: str, b: str) -> dict[str, Any]:
    """The same metrics for two prompt versions, side by side: counts, rates
    with Wilson 95% intervals (over finished runs; the reward's solved rate
    over the runs with a reward), means and percentiles, the distributions
    of steps and cost, and the tasks whose solved rate (:data:`SOLVED`)
    differs between the two."""
    t.require("runs")
    versions = [a, b]
    metrics = t.df(
        _FLAGGED_RUNS + """
        SELECT prompt_version, count(*) AS runs, count(*) FILTER (finished) AS finished,
               count(*) FILTER (status = 'SUCCEEDED') AS success,
               count(*) FILTER (finished AND looped) AS loop,
               count(*) FILTER (status = 'BUDGET_EXHAUSTED') AS budget_stop,
               count(reward) AS rewarded, count(*) FILTER (reward >= 1) AS solved, avg(reward) AS mean_reward,
               avg(steps) AS mean_steps, quantile_cont(steps, 0.5) AS p50_steps,
               quantile_cont(steps, 0.9) AS p90_steps,
               avg(""" + _tokens() + """) AS mean_tokens, avg(cost_usd) AS mean_cost_usd,
               sum(cost_usd) AS cost_usd, avg(tool_calls) AS mean_tool_calls,
               count(""" + _tokens() + """) AS runs_with_tokens, count(cost_usd) AS runs_with_cost
        FROM flagged WHERE prompt_version IN $versions GROUP BY prompt_version
        """,
        {**_terminal(), "versions": versions},
    ).set_index("prompt_version")
    rates: dict[str, dict[str, dict[str, float]]] = {}
    for version in versions:
        rates[version] = {}
        finished = int(metrics.at[version, "finished"]) if version in metrics.index else 0
        rewarded = int(metrics.at[version, "rewarded"]) if version in metrics.index else 0
        for rate, n in (*((r, finished) for r in RATES), ("solved", rewarded)):
            k = int(metrics.at[version, rate]) if version in metrics.index else 0
            lo, hi = wilson(k, n)
            rates[version][rate] = {"k": k, "n": n, "rate": k / n if n else 0.0, "lo": lo, "hi": hi}
    steps = t.df("SELECT prompt_version, steps, count(*) AS runs FROM runs WHERE prompt_version IN $versions "
                 "GROUP BY ALL ORDER BY steps", {"versions": versions})
    cost = t.df(
        """
        WITH w AS (SELECT greatest(max(cost_usd) / 20, 1e-9) AS width FROM runs WHERE prompt_version IN $versions)
        SELECT prompt_version, floor(cost_usd / w.width) * w.width AS cost_from, count(*) AS runs
        FROM runs, w WHERE prompt_version IN $versions AND cost_usd IS NOT NULL
        GROUP BY ALL ORDER BY cost_from
        """,
        {"versions": versions},
    )
    tasks = t.df(
        f"""
        SELECT task_id,
               round(avg(CASE WHEN {SOLVED} THEN 1.0 ELSE 0.0 END) FILTER (prompt_version = $a), 3) AS solved_a,
               round(avg(CASE WHEN {SOLVED} THEN 1.0 ELSE 0.0 END) FILTER (prompt_version = $b), 3) AS solved_b,
               count(*) FILTER (prompt_version = $a) AS runs_a, count(*) FILTER (prompt_version = $b) AS runs_b,
               count(*) OVER () AS differing
        FROM runs WHERE prompt_version IN ($a, $b) AND status IN $terminal
        GROUP BY task_id
        -- A task run under one version only has no rate to compare.
        HAVING runs_a > 0 AND runs_b > 0 AND solved_a <> solved_b
        ORDER BY abs(coalesce(solved_b, 0) - coalesce(solved_a, 0)) DESC, task_id
        LIMIT $task_rows
        """,
        {**_terminal(), "a": a, "b": b, "task_rows": TASK_ROWS},
    )
    differing = int(tasks["differing"].iloc[0]) if not tasks.empty else 0
    tasks = tasks.drop(columns="differing")
    # A version name run under two prompt texts (a prompts/ file edited in
    # between): its figures pool both, which the page must say.
    texts: dict[str, list[str]] = {}
    if t.has("candidates"):
        for version, hashes in t.df(
                "SELECT prompt_version, list(DISTINCT prompt_hash ORDER BY prompt_hash) AS hashes FROM candidates "
                "WHERE prompt_version IN $versions AND prompt_hash IS NOT NULL GROUP BY ALL",
                {"versions": versions}).itertuples(index=False):
            texts[version] = list(hashes)
    (shared,) = t.one(
        "SELECT count(*) FROM (SELECT task_id FROM runs WHERE prompt_version IN ($a, $b) AND status IN $terminal "
        "GROUP BY task_id HAVING count(DISTINCT prompt_version) = 2)",
        {**_terminal(), "a": a, "b": b},
    )
    return {"metrics": metrics, "rates": rates, "steps": steps, "cost": cost, "tasks": tasks,
            "tasks_differing": differing, "shared_tasks": int(shared), "prompt_texts": texts}
