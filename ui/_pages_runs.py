"""Runs page: filter, sort and page through runs; open one."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

import streamlit as st

from loopledger.ui import _queries as q
from loopledger.ui._st import grid, guarded, left_out, load, open_run_picker, pager, remember, run_link_column, run_url, times


def _filters(options: dict) -> q.RunFilter:
    with st.expander("Filters", expanded=True):
        c1, c2, c3 = st.columns(3)
        statuses = c1.multiselect("Status", options["status"], key=remember("runs_status", options["status"]))
        reasons = c2.multiselect("Reason", options["reason"], key=remember("runs_reason", options["reason"]))
        versions = c3.multiselect("Prompt version", options["prompt_version"],
                                  key=remember("runs_version", options["prompt_version"]))
        c1, c2, c3 = st.columns(3)
        tenants = c1.multiselect("Tenant", options["tenant"], key=remember("runs_tenant", options["tenant"]))
        detectors = c2.multiselect("Detector", options["detector"], key=remember("runs_detector", options["detector"]),
                                   help="runs with a finding of this loop detector")
        task = c3.text_input("Task contains", key=remember("runs_task"))
        lo, hi = options["started"]
        started_from = started_to = None
        if lo is not None and hi is not None:
            span = (lo.date(), hi.date())
            # The range the runs span grows as runs are recorded: a pick
            # left at the whole range follows it (new runs are not hidden
            # behind the range of the page's first view); only a narrowed
            # range filters.
            remember("runs_dates")
            before = st.session_state.get("runs_dates_span")
            if "runs_dates" not in st.session_state or (
                    before != span and tuple(st.session_state["runs_dates"]) == before):
                st.session_state["runs_dates"] = span
            st.session_state["runs_dates_span"] = span
            remember("runs_dates")
            kept = tuple(st.session_state["runs_dates"])
            picked = st.date_input("Started between", min_value=min(span[0], *kept), max_value=max(span[1], *kept),
                                   key="runs_dates")
            if isinstance(picked, (tuple, list)) and len(picked) == 2 and tuple(picked) != span:
                started_from = datetime.combine(picked[0], time.min, tzinfo=timezone.utc)
                started_to = datetime.combine(picked[1], time.min, tzinfo=timezone.utc) + timedelta(days=1)
    return q.RunFilter(tuple(statuses), tuple(reasons), tuple(versions), tuple(tenants), tuple(detectors),
                       task.strip(), started_from, started_to)


def _body() -> None:
    left_out("loop_diagnoses", "The runs' loop findings are left out here: no detector to filter by, and none "
                               "counted per run.")
    options = load(q.run_filter_options)
    flt = _filters(options)
    c1, c2 = st.columns([3, 1])
    sort = c1.selectbox("Sort by", q.SORTABLE, key=remember("runs_sort", q.SORTABLE))
    descending = c2.toggle("Descending", key=remember("runs_desc", default=True))
    total = load(q.runs_count, flt)
    offset, limit = pager(total, "runs", noun="runs", reset_on=(flt, sort, descending))
    _, page = load(q.runs_page, flt, sort, descending, offset, limit)
    if page.empty:
        st.info("No run matches these filters.")
        return
    page = page.copy()
    page.insert(0, "open", [run_url(r) for r in page["run_id"]])
    # Outcome first: the columns an analyst scans before opening a run (an
    # imported run's reward says whether its task was done; its status does not).
    reward = ["reward"] if page["reward"].notna().any() else []
    order = ["open", "status", "reason", *reward, "task_id", "prompt_version", "detectors", "steps", "tool_calls",
             "tokens", "cost_usd", "duration_s", "tenant", "model_route", "started_at", "ended_at"]
    # Sums of float prices carry noise in their last digits (5.579595000000001).
    config = {"open": run_link_column("run"), "cost_usd": st.column_config.NumberColumn("cost_usd", format="%.6f")}
    grid(times(page, "started_at", "ended_at"), hide_index=True, column_order=order, column_config=config, key="runs_table")
    open_run_picker(list(page["run_id"]), "runs")


def render() -> None:
    guarded("Runs", _body)


if __name__ == "__main__":
    render()
