"""Loop diagnoses page: findings by detector and pattern, how many of their
runs failed, and a drill-down to the runs and steps."""

from __future__ import annotations

from typing import Any

import plotly.express as px
import streamlit as st

from loopledger.ui import _queries as q
from loopledger.ui._st import (chart_text, code, grid, guarded, load, open_run_picker, pager, remember,
                               replay_named, run_link_column, run_url)

ANY = "(any)"


def _source() -> str:
    """Whose findings: the detectors' while the runs ran, or a replay's
    (named with the suite it ran)."""
    sources = load(q.diagnosis_sources) or [q.RECORDED]
    return st.selectbox("Findings of", sources, key=remember("diag_source", sources, sources[0]),
                        format_func=replay_named() if len(sources) > 1 else str,
                        help="recorded: the detectors that ran with the engine; a replay: its suite's detectors, "
                             "run in batch over the same recorded steps")


def _options(key: str, values: Any) -> list[str]:
    """``(any)`` and the values; a choice the new source lacks goes back to ``(any)``."""
    options = [ANY, *sorted(set(values))]
    remember(key, options, ANY)
    return options


def _body() -> None:
    source = _source()
    if source == q.RECORDED and (unreadable := load(q.unreadable_tables).get("loop_diagnoses")):
        st.error(f"{unreadable}.")
        return
    summary = load(q.diagnoses_summary, source=source)
    if summary.empty:
        st.info("No loop diagnoses recorded. The engine's detectors fired on none of its runs; imported runs "
                "have none recorded (no detector ran while they ran): replay them (`loopledger replay --suite "
                "default`) and pick the replay above." if source == q.RECORDED
                else f"Replay {code(source)} found no loops: none of its detectors fired on these runs.")
        return
    if source == q.RECORDED:
        suites = load(q.recorded_suites, with_findings=True)
        if len(suites) > 1:
            st.warning(f"The recorded findings come from runs recorded under {len(suites)} suite versions "
                       f"({', '.join(code(s) for s in suites)}), whose detectors may differ in their thresholds: "
                       "the figures below pool them. A replay judges every run with one suite.")
    cols = st.columns(3)
    cols[0].metric("Findings", f"{int(summary['findings'].sum()):,}")
    # A run can have findings of several detectors: counted once here.
    totals = load(q.diagnoses_totals, source=source)
    cols[1].metric("Runs with a finding", f"{totals['runs']:,}")
    if totals["runs_known"]:
        cols[2].metric("Of them failed", f"{totals['runs_failed']:,}",
                       help="ended in a terminal state other than SUCCEEDED"
                       + (f"; of the {totals['runs_known']:,} runs whose outcome these traces hold"
                          if totals["runs_known"] < totals["runs"] else ""))
    else:
        cols[2].metric("Of them failed", "—", help="these traces hold none of these runs' outcomes")
    # A detector found under two versions is two bars: a version's change is
    # not a change of the runs.
    versions = summary.groupby("detector")["detector_version"].transform("nunique")
    drawn = summary.assign(detector=[f"{d} (v{v})" if n > 1 else d for d, v, n in
                                     zip(summary["detector"], summary["detector_version"], versions)])
    if (versions > 1).any():
        st.warning("Some detectors' findings come from two versions of them: shown apart, never added up.")
    fig = px.bar(chart_text(drawn, "detector", "pattern"), x="detector", y="findings", color="pattern",
                 title="Findings by detector and pattern")
    fig.update_layout(height=320, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="diag_by_detector")
    grid(summary, hide_index=True, key="diag_summary")
    by_step = load(q.diagnoses_by_step, source=source)
    fig = px.bar(chart_text(by_step, "detector"), x="step", y="findings", color="detector",
                 title="Step at which detectors fired")
    fig.update_layout(height=280, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="diag_by_step")

    st.subheader("Drill down")
    c1, c2 = st.columns(2)
    detector = c1.selectbox("Detector", _options("diag_detector", summary["detector"]), key="diag_detector")
    patterns = summary if detector == ANY else summary[summary["detector"] == detector]
    pattern = c2.selectbox("Pattern", _options("diag_pattern", patterns["pattern"]), key="diag_pattern")
    det = None if detector == ANY else detector
    pat = None if pattern == ANY else pattern
    total = load(q.diagnosis_count, det, pat, source=source)
    offset, limit = pager(total, "diag", noun="findings", reset_on=(source, det, pat))
    _, page = load(q.diagnosis_findings, det, pat, offset, limit, source=source)
    page = page.copy()
    page.insert(0, "open", [run_url(r) for r in page["run_id"]])
    grid(page, hide_index=True, column_config={"open": run_link_column("open")}, key="diag_findings")
    open_run_picker(list(dict.fromkeys(page["run_id"])), "diag")


def render() -> None:
    guarded("Loop diagnoses", _body)


if __name__ == "__main__":
    render()
