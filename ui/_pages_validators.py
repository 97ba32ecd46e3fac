"""Compare validators page: two suites' decisions over the same recorded
candidates (the recorded decisions vs a replay, or two replays)."""

from __future__ import annotations

import shlex
from typing import Any

import plotly.express as px
import streamlit as st

from loopledger.ui import _compare as c
from loopledger.ui._st import (chart_label, chart_text, code, grid, guarded, home, load, pager, remember,
                               replay_named, run_link_column, run_url, traces)


def _pick(sides: list[str]) -> tuple[str, str]:
    remember("cmp_a", sides, sides[0])
    remember("cmp_b", sides, sides[1] if len(sides) > 1 else sides[0])
    named = replay_named()
    left, mid, right = st.columns([3, 1, 3])
    a = left.selectbox("Baseline (A)", sides, key="cmp_a", format_func=named)
    mid.write("")
    mid.button("⇄ Swap", key="cmp_swap", on_click=_swap)
    b = right.selectbox("Compared (B)", sides, key="cmp_b", format_func=named)
    return a, b


def _as_sides(frame: Any) -> Any:
    """Columns of side A and side B named so, whichever is the recorded
    decisions and whichever a replay (the queries say baseline and replay)."""
    return frame.rename(columns=lambda c: "A_" + c.removeprefix("baseline_") if c.startswith("baseline_")
                        else "B_" + c.removeprefix("replay_") if c.startswith("replay_") else c)


def _swap() -> None:
    st.session_state["cmp_a"], st.session_state["cmp_b"] = st.session_state["cmp_b"], st.session_state["cmp_a"]


def _body() -> None:
    sides = c.sides(traces())
    if len(sides) < 2:
        st.info("Nothing to compare yet: this needs the recorded decisions and at least one replay. Run e.g. "
                f"`loopledger replay --suite default --home {shlex.quote(str(home()))}`, then reload.")
        if not sides:
            return
    for replay_id, why in load(c.unreadable_replays).items():
        st.warning(f"Replay {code(replay_id)} cannot be read and is left out: {code(why)}")
    summaries = load(c.replay_summaries)
    if not summaries.empty:
        st.markdown("**Replays**")
        grid(summaries, hide_index=True, key="cmp_replays")
        st.caption("Each replay's summary as it computed it when it ran, with the labels of then; the "
                   "comparison below counts regressions and fixes with today's labels.")
    if len(sides) < 2:
        return
    a, b = _pick(sides)
    if a == b:
        st.warning("Pick two different suites.")
        return
    data = load(c.compare_validators, a, b)
    tot = data["totals"]
    if len(data["recorded_suites"]) > 1:
        st.warning(f"The recorded decisions were made under {len(data['recorded_suites'])} suite versions "
                   f"({', '.join(code(s) for s in data['recorded_suites'])}): runs recorded under different suites "
                   "are compared alike, and a flip on a run recorded under another suite can be that suite's "
                   "difference, not the run's.")
    cols = st.columns(6)
    cols[0].metric("Decisions (B)", f"{tot['decisions']:,}")
    cols[1].metric("Flips", f"{tot['flips']:,}", help="decisions whose verdict or code differs"
                   + (f"; {tot['flips_across_versions']:,} of them between two versions of a validator"
                      if tot["flips_across_versions"] else ""))
    cols[2].metric("Verdict flips", f"{tot['verdict_flips']:,}")
    cols[3].metric("Runs diverged", f"{tot['runs_diverged']:,}")
    unknown = "—"  # the labels could not be read (said below)
    cols[4].metric("Regressions", unknown if tot["regressions"] is None else f"{tot['regressions']:,}",
                   help="a label agreed with A and disagrees with B")
    cols[5].metric("Fixes", unknown if tot["fixes"] is None else f"{tot['fixes']:,}",
                   help="a label disagreed with A and agrees with B")
    st.caption(f"A = {code(a)}, B = {code(b)}" + (" · flips read from B's diffs table" if data["used_diffs"] else "")
               + (f" · {tot['not_compared']:,} candidate(s) one replay made no decision on (its run recorded "
                  "after it, or outside its traces): not compared" if tot["not_compared"] else ""))

    st.subheader("Flips by validator and code")
    flips = data["by_validator"]
    if tot["flips_across_versions"]:
        changed = flips[flips["across_versions"]]
        pairs = sorted({f"{r.validator} {r.baseline_version}→{r.replay_version}" for r in changed.itertuples()})
        st.warning(f"{tot['flips_across_versions']:,} of the {tot['flips']:,} flips compare two versions of a "
                   f"validator ({', '.join(code(p) for p in pairs)}): the validator changed, not the runs. They are "
                   "shown apart below (\"across versions\"), never as a trend in the data.")
    if flips.empty:
        st.success("No decision differs between the two suites.")
    else:
        per_validator = flips.assign(
            validator=[f"{r.validator} ({r.baseline_version}→{r.replay_version})" if r.across_versions
                       else r.validator for r in flips.itertuples()],
            flip=["across versions" if a else "same version" for a in flips["across_versions"]],
        ).groupby(["validator", "flip"], as_index=False)["flips"].sum()
        fig = px.bar(chart_text(per_validator, "validator"), x="validator", y="flips", color="flip",
                     title="Flips per validator",
                     color_discrete_map={"same version": "#1f77b4", "across versions": "#ff7f0e"})
        fig.update_layout(height=300, margin={"t": 40, "b": 10})
        st.plotly_chart(fig, key="cmp_flips")
        grid(_as_sides(flips), hide_index=True, key="cmp_flips_table")

    st.subheader("Verdicts: A (rows) × B (columns)")
    confusion = data["confusion"]
    fig = px.imshow(confusion, text_auto=True, color_continuous_scale="Blues",
                    labels={"x": f"B: {chart_label(b)}", "y": f"A: {chart_label(a)}", "color": "decisions"})
    fig.update_layout(height=360, margin={"t": 20, "b": 10})
    st.plotly_chart(fig, key="cmp_confusion")
    st.table(confusion.rename_axis(index="A", columns="B"))

    st.subheader("Against labels")
    labels = data["labels"]
    if data["labels_error"]:
        st.error(data["labels_error"])
    elif labels.empty:
        st.caption("No labels yet: label decisions on a Run page.")
    else:
        grid(_as_sides(labels), hide_index=True, key="cmp_labels")

    st.subheader("Divergence points")
    st.caption("A run's divergence point is its first step where a decision differs: past it, the recorded "
               "path is not what B would have produced.")
    div = data["divergence"]
    if div.empty:
        st.caption("No run diverged.")
        return
    fig = px.bar(data["divergence_by_step"], x="divergence_step", y="runs", title="Runs by divergence step")
    fig.update_layout(height=260, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="cmp_div_steps")
    if tot["runs_diverged"] > len(div):
        st.caption(f"Listing the {len(div):,} runs with the most flips of {tot['runs_diverged']:,}.")
    offset, limit = pager(len(div), "cmp_div", noun="runs", reset_on=(data["a"], data["b"]))
    page = div.iloc[offset: offset + limit].copy()
    page.insert(0, "open", [run_url(r) for r in page["run_id"]])
    grid(page, hide_index=True, column_config={"open": run_link_column("open")}, key="cmp_div")


def render() -> None:
    guarded("Compare validators", _body)


if __name__ == "__main__":
    render()
