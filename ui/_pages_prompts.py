"""Compare prompt versions page: the same metrics for two prompt versions,
with the number of runs and 95% Wilson intervals for the rates."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from loopledger.ui import _queries as q
from loopledger.ui._st import chart_label, chart_text, code, grid, guarded, left_out, load, missing, pct, remember

RATE_NAMES = {"success": "Success rate", "loop": "Loop rate", "budget_stop": "Budget-stop rate"}
#: Shown when either version has runs whose source scored them (imported runs).
REWARD_RATE = {"solved": "Task solved (reward)"}
MEANS = (("runs", "Runs", "{:,.0f}"), ("finished", "Finished runs", "{:,.0f}"),
         ("mean_steps", "Mean steps", "{:.2f}"), ("p50_steps", "Median steps", "{:.1f}"),
         ("p90_steps", "p90 steps", "{:.1f}"), ("mean_tokens", "Mean tokens", "{:,.1f}"),
         ("mean_tool_calls", "Mean tool calls", "{:.2f}"), ("mean_cost_usd", "Mean cost (USD)", "{:.6f}"),
         ("cost_usd", "Total cost (USD)", "{:.4f}"))


def _shown(fmt: str, value: object) -> str:
    """A figure, or a dash where no run of the version reports it."""
    return "—" if missing(value) else fmt.format(value)


def rate_text(r: dict) -> str:
    if not r["n"]:
        return "— (0/0)"  # no run to have a rate of
    return f"{pct(r['rate'])} [{pct(r['lo'])}–{pct(r['hi'])}] ({r['k']}/{r['n']})"


def rate_gap(ra: dict, rb: dict) -> str:
    return "—" if not ra["n"] or not rb["n"] else f"{100 * (rb['rate'] - ra['rate']):+.1f} pts"


#: Version A's colour and version B's, in every chart of the page.
SIDE_COLOURS = ("#0068c9", "#83c9ff")


def _body() -> None:
    versions = load(q.prompt_versions)
    if len(versions) < 2:
        named = ", ".join(code(v) for v in versions) or "none"
        st.info(f"Only {len(versions)} prompt version recorded ({named}); run the "
                "scenarios under a second one, e.g. `loopledger run ... --prompt-version v2`.")
        return
    c1, c2 = st.columns(2)
    a = c1.selectbox("Version A", versions, key=remember("pv_a", versions, versions[0]))
    b = c2.selectbox("Version B", versions, key=remember("pv_b", versions, versions[1]))
    if a == b:
        st.warning("Pick two different prompt versions.")
        return
    data = load(q.prompt_compare, a, b)
    metrics, rates = data["metrics"], data["rates"]
    for version in (a, b):
        texts = data["prompt_texts"].get(version, [])
        if len(texts) > 1:
            st.warning(f"Version {code(version)} was run under {len(texts)} different prompt texts (prompt_hash "
                       f"{', '.join(code(h[:12]) for h in texts)}): its figures below pool them. Give each text "
                       "a version name of its own to compare them.")
    rewarded = any(rates[v]["solved"]["n"] for v in (a, b))
    names = {**RATE_NAMES, **REWARD_RATE} if rewarded else RATE_NAMES
    if left_out("loop_diagnoses", "The loop rates count the runs with a loop finding: they are not shown."):
        names = {name: label for name, label in names.items() if name != "loop"}
    rows = []
    for name, label in names.items():
        rows.append({"metric": label, a: rate_text(rates[a][name]), b: rate_text(rates[b][name]),
                     "B − A": rate_gap(rates[a][name], rates[b][name])})
    for column, label, fmt in MEANS + ((("mean_reward", "Mean reward", "{:.3f}"),) if rewarded else ()):
        va = metrics.at[a, column] if a in metrics.index else 0
        vb = metrics.at[b, column] if b in metrics.index else 0
        rows.append({"metric": label, a: _shown(fmt, va), b: _shown(fmt, vb),
                     "B − A": _shown(fmt, None if missing(va) or missing(vb) else vb - va)})
    st.caption("Rates over finished runs (the reward's over runs with a reward: an imported run's status only "
               "says how its conversation ended), with a 95% Wilson interval and k/n.")
    st.table(pd.DataFrame(rows).set_index("metric"))
    partial = [f"{code(v)}: tokens {int(metrics.at[v, 'runs_with_tokens']):,}, cost "
               f"{int(metrics.at[v, 'runs_with_cost']):,} of {int(metrics.at[v, 'runs']):,} runs"
               for v in (a, b) if v in metrics.index
               and min(metrics.at[v, "runs_with_tokens"], metrics.at[v, "runs_with_cost"]) < metrics.at[v, "runs"]]
    if partial:
        st.caption("Tokens and cost are over the runs that report them (an imported run's source may not): "
                   + "; ".join(partial) + ".")

    # One colour per version on the whole page, A's first, whatever order the data comes in.
    colours = {chart_label(a): SIDE_COLOURS[0], chart_label(b): SIDE_COLOURS[1]}
    bars = go.Figure()
    for version in (a, b):
        r = rates[version]
        bars.add_bar(name=chart_label(version), x=list(names.values()),
                     y=[r[n]["rate"] if r[n]["n"] else None for n in names],  # no runs: no bar
                     marker_color=colours[chart_label(version)],
                     error_y={"type": "data", "symmetric": False,
                              "array": [r[n]["hi"] - r[n]["rate"] for n in names],
                              "arrayminus": [r[n]["rate"] - r[n]["lo"] for n in names]})
    bars.update_layout(barmode="group", title="Rates with 95% intervals", yaxis_tickformat=".0%", height=340,
                       margin={"t": 40, "b": 10})
    st.plotly_chart(bars, key="pv_rates")

    left, right = st.columns(2)
    steps = data["steps"]
    order = {"prompt_version": list(colours)}
    fig = px.bar(chart_text(steps, "prompt_version"), x="steps", y="runs", color="prompt_version", barmode="group",
                 title="Steps per run", color_discrete_map=colours, category_orders=order)
    fig.update_layout(height=300, margin={"t": 40, "b": 10})
    left.plotly_chart(fig, key="pv_steps")
    cost = data["cost"]
    fig = px.bar(chart_text(cost, "prompt_version"), x="cost_from", y="runs", color="prompt_version",
                 barmode="group", title="Cost per run (USD, 20 bins)", color_discrete_map=colours,
                 category_orders=order)
    fig.update_layout(height=300, margin={"t": 40, "b": 10})
    right.plotly_chart(fig, key="pv_cost")

    st.subheader("Tasks solved at different rates")
    st.caption("A run counts as solved when its source scored it so (reward ≥ 1), else when it SUCCEEDED.")
    tasks = data["tasks"]
    if not data["shared_tasks"]:
        st.caption("No task was run to an end under both versions: there is nothing to compare task by task.")
    elif tasks.empty:
        st.caption(f"Each of the {data['shared_tasks']:,} tasks run to an end under both versions is solved "
                   "equally often under both (a run still waiting is not counted yet).")
    else:
        if data["tasks_differing"] > len(tasks):
            st.caption(f"Listing the {len(tasks):,} most different of the {data['tasks_differing']:,} tasks "
                       "solved at different rates.")
        grid(tasks.rename(columns={"solved_a": f"solved {a}", "solved_b": f"solved {b}",
                                           "runs_a": f"runs {a}", "runs_b": f"runs {b}"}),
                     hide_index=True, key="pv_tasks")


def render() -> None:
    guarded("Compare prompt versions", _body)


if __name__ == "__main__":
    render()
