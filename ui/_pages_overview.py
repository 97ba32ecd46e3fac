"""Overview page: outcomes, rates, effort and where the time went."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

from loopledger.ui import _queries as q
from loopledger.ui._data import DataError
from loopledger.ui._st import chart_text, grid, guarded, left_out, load, pct


def _body() -> None:
    data = load(q.overview)
    tot = data["totals"]
    no_findings = left_out("loop_diagnoses", "The loop rate counts the runs with a loop finding: it is not shown.")
    cols = st.columns(4)
    cols[0].metric("Runs", f"{tot['runs']:,}", help="Finished (terminal) runs: " f"{tot['finished']:,}")
    cols[1].metric("Success rate", pct(tot["success_rate"]), help="SUCCEEDED / finished runs")
    cols[2].metric("Loop rate", "—" if no_findings else pct(tot["loop_rate"]),
                   help="finished runs stopped by a loop detector or with a loop diagnosis")
    cols[3].metric("Budget-stop rate", pct(tot["budget_rate"]), help="BUDGET_EXHAUSTED / finished runs")
    cols = st.columns(4)
    cols[0].metric("Mean steps", f"{tot['mean_steps']:.2f}")
    reported = _reported(tot["runs_with_tokens"], tot["runs"])
    cols[1].metric("Tokens", f"{tot['tokens_in'] + tot['tokens_out']:,}" if tot["runs_with_tokens"] else "—",
                   help=f"in {tot['tokens_in']:,} · out {tot['tokens_out']:,}{reported}")
    reported = _reported(tot["runs_with_cost"], tot["runs"])
    cols[2].metric("Cost (USD)", f"{tot['cost_usd']:.4f}" if tot["runs_with_cost"] else "—",
                   help=f"mean per run {tot['mean_cost_usd']:.6f}{reported}")
    cols[3].metric("Tool calls", f"{tot['tool_calls']:,}", help=f"model attempts {tot['model_attempts']:,}")
    if tot["rewarded"]:
        cols = st.columns(4)
        cols[0].metric("Task solved (reward)", pct(tot["reward_rate"]),
                       help=f"runs whose source scored the task solved (reward ≥ 1): {tot['reward_solved']:,} of "
                            f"{tot['rewarded']:,} runs with a reward. An imported run's status only says how its "
                            "conversation ended; the reward says whether the task was done.")
        cols[1].metric("Mean reward", f"{tot['mean_reward']:.3f}")

    st.subheader("Runs by status, reason, prompt version and model")
    breakdowns = data["breakdowns"]
    left, right = st.columns(2)
    for column, dim, title in ((left, "status", "Status"), (right, "reason", "Reason"),
                               (left, "prompt_version", "Prompt version"), (right, "model_route", "Model")):
        frame = breakdowns.get(dim)
        if frame is None or frame.empty:
            continue
        fig = px.bar(chart_text(frame, "value"), x="value", y="runs", title=title, labels={"value": dim})
        fig.update_layout(height=300, margin={"t": 40, "b": 10})
        column.plotly_chart(fig, key=f"overview_{dim}")

    by_version = data["by_version"]
    if not by_version.empty:
        fig = px.bar(chart_text(by_version, "prompt_version", "model_route"), x="prompt_version", y="runs",
                     color="status", barmode="stack",
                     facet_col="model_route", title="Status by prompt version and model")
        fig.update_layout(height=340, margin={"t": 60, "b": 10})
        st.plotly_chart(fig, key="overview_version_status")
        grid(by_version, hide_index=True)

    st.subheader("Processing time vs waiting time")
    st.caption("Waiting: time in WAITING_USER and WAITING_TOOL (a waiting run holds no worker); "
               "queued: from a run's creation until an engine took it up; "
               "processing: every other state. From the transition events' timestamps.")
    try:
        time = load(q.time_split)
    except DataError as exc:
        # Only this part reads the events: the figures above stand.
        st.error(str(exc))
        return
    if time.empty:
        st.info("No transition events recorded yet.")
        return
    cols = st.columns(3)
    cols[0].metric("Processing (s)", f"{time['processing_s'].sum():,.2f}")
    cols[1].metric("Waiting (s)", f"{time['waiting_s'].sum():,.2f}")
    cols[2].metric("Queued (s)", f"{time['queued_s'].sum():,.2f}")
    long = time.melt(id_vars=["prompt_version", "runs"], value_vars=["processing_s", "waiting_s", "queued_s"],
                     var_name="time", value_name="seconds")
    fig = px.bar(chart_text(long, "prompt_version"), x="prompt_version", y="seconds", color="time", barmode="group",
                 title="Seconds by prompt version")
    fig.update_layout(height=320, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="overview_time")


def _reported(known: int, runs: int) -> str:
    """What a usage figure covers when some runs do not report usage (runs
    imported from sources that give none)."""
    if known == runs:
        return ""
    return f"; over the {known:,} of {runs:,} runs that report it (imported sources may not)"


def render() -> None:
    guarded("Overview", _body)


if __name__ == "__main__":
    render()
