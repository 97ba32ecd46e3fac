"""Labels page: every label (human, scenario, import), filtered by source,
paged and exported as CSV. Labels are added from a Run page."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

from loopledger.ui import _compare as c
from loopledger.ui._st import grid, guarded, load, pager, remember, run_link_column, run_url, times

ANY = "(any)"


def _body() -> None:
    st.caption("Add a label from a run's page (Run → Labels): pick a decision and its expected verdict.")
    summary = load(c.labels_summary)
    if summary.empty:
        st.info("No labels yet. Open a run, then label a decision's expected verdict in its Labels tab.")
        return
    cols = st.columns(3)
    cols[0].metric("Labels", f"{int(summary['labels'].sum()):,}")
    cols[1].metric("Human", f"{int(summary.loc[summary['source'] == 'human', 'labels'].sum()):,}")
    cols[2].metric("Other sources", f"{int(summary.loc[summary['source'] != 'human', 'labels'].sum()):,}")
    fig = px.bar(summary, x="expected_verdict", y="labels", color="source", title="Labels by expected verdict")
    fig.update_layout(height=280, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="labels_chart")
    sources = [ANY, *sorted(summary["source"].unique())]
    source = st.selectbox("Source", sources, key=remember("labels_source", sources, ANY))
    chosen = None if source == ANY else source
    total = load(c.labels_count, chosen)
    offset, limit = pager(total, "labels", noun="labels", reset_on=chosen)
    _, page = load(c.labels_page, chosen, offset, limit)
    page = page.copy()
    page.insert(0, "open", [run_url(r) for r in page["run_id"]])
    grid(times(page, "created_at"), hide_index=True, column_config={"open": run_link_column("open")},
                 key="labels_table")
    st.download_button("Export all labels (CSV)", load(c.labels_csv), file_name="labels.csv", mime="text/csv",
                       key="labels_export")


def render() -> None:
    guarded("Labels", _body)


if __name__ == "__main__":
    render()
