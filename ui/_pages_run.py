"""Run page: one run's timeline, candidates, decisions, operations, waits,
loop diagnosis and labels. Deep link: ``run?run_id=<id>``."""

from __future__ import annotations

import json

import pandas as pd
import plotly.express as px
import streamlit as st

from loopledger.ui import _queries as q
from loopledger.ui._data import VERDICTS, DataError
from loopledger.ui._labels import add_human_label, no_journal
from loopledger.ui._st import code, grid, guarded, home, let_exports_in, load, missing, store_url, times


def _json(text: object) -> object:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _header(run: dict, spans: pd.DataFrame) -> None:
    # Recorded (often imported) text: shown as written, never as Markdown.
    st.markdown(f"**Task** {code(run['task_id'])} · **tenant** {code(run['tenant'])} · **prompt** "
                f"{code(run['prompt_version'])} · **model** {code(run['model_route'])} · **thread** "
                f"{code(run['thread_id'])}")
    if not missing(run.get("reward")):
        st.markdown(f"**Reward** {float(run['reward']):g}: the source's score of the task (an imported run's "
                    "status only says how its conversation ended; the reward says whether the task was done)")
    cols = st.columns([3, 3, 2, 2, 2])  # BUDGET_EXHAUSTED and validation_failed need the room
    cols[0].metric("Status", str(run["status"]))
    cols[1].metric("Reason", "—" if missing(run["reason"]) else str(run["reason"]))
    cols[2].metric("Steps", int(run["steps"] or 0))
    cols[3].metric("Model attempts", int(run["model_attempts"] or 0))
    cols[4].metric("Tool calls", int(run["tool_calls"] or 0))
    cols = st.columns(6)
    # Null where an imported run's source gives no usage: unknown, not 0.
    partial = missing(run["tokens_in"]) or missing(run["tokens_out"])
    cols[0].metric("Tokens", "—" if missing(run["tokens"]) else f"{int(run['tokens']):,}",
                   help="the source of this imported run does not give all its usage" if partial else None)
    cols[1].metric("Cost (USD)", "—" if missing(run["cost_usd"]) else f"{float(run['cost_usd']):.4f}")
    closed = spans.iloc[:-1] if len(spans) else spans  # the last span is the terminal point or still open
    queued = closed["queued"].astype(bool)  # (an empty frame's column is not boolean)
    unknown = spans.empty  # no transition read (the events unreadable): no split of the time to show
    cols[2].metric("Processing (s)", "—" if unknown else f"{closed.loc[~closed['waiting'] & ~queued, 'seconds'].sum():.3f}")
    still = not unknown and pd.isna(run["ended_at"]) and bool(spans.iloc[-1]["waiting"])  # in a wait now
    cols[3].metric("Waiting (s)", "—" if unknown else f"{closed.loc[closed['waiting'], 'seconds'].sum():.3f}",
                   help="finished waits; the wait this run is in now is counted once it ends" if still else None)
    cols[4].metric("Queued (s)", "—" if unknown else f"{closed.loc[queued, 'seconds'].sum():.3f}",
                   help="from the run's creation until an engine took it up")
    started, ended = run["started_at"], run["ended_at"]
    cols[5].metric("Duration (s)", "—" if pd.isna(ended) else f"{(ended - started).total_seconds():.3f}")


def _timeline(spans: pd.DataFrame) -> None:
    if spans.empty:
        st.info("No transition events recorded for this run.")
        return
    drawn = spans.copy()
    # A zero-length span (the terminal state) would be invisible.
    drawn.loc[drawn["end"] <= drawn["start"], "end"] = drawn["start"] + pd.Timedelta(milliseconds=1)
    drawn["step"] = drawn["step"].astype(str)
    fig = px.timeline(drawn, x_start="start", x_end="end", y="state", color="step",
                      hover_data={"attempt": True, "seconds": ":.4f"}, title="State timeline")
    fig.update_yaxes(categoryorder="array", categoryarray=list(dict.fromkeys(drawn["state"]))[::-1])
    fig.update_layout(height=360, margin={"t": 40, "b": 10})
    st.plotly_chart(fig, key="run_gantt")


def _candidates(detail: dict, run_id: str) -> None:
    cands, contexts = detail["candidates"], detail["contexts"]
    if cands.empty:
        st.info("No candidates recorded for this run.")
        return
    sizes = dict(zip(contexts["artifact_id"], contexts["size_bytes"], strict=False))
    for row in cands.itertuples():
        title = f"Step {row.step} · attempt {row.attempt} · finish {code(row.finish_reason)}"
        with st.expander(title, expanded=False):
            st.caption(f"candidate {code(row.candidate_id)}")
            size = sizes.get(row.context_artifact_id)
            st.markdown(f"Context artifact {code(row.context_artifact_id)}"
                        + (f" ({int(size):,} bytes)" if size is not None else " (not in the artifacts table)"))
            st.json(_json(row.items_json), expanded=2)
            if size is not None and st.toggle("Show the context artifact", key=f"ctx_{row.step}_{row.attempt}"):
                body = load(q.artifact_body, row.context_artifact_id)
                st.json(_json(body), expanded=1)


def _decisions(detail: dict) -> None:
    vals = detail["validations"]
    if vals.empty:
        st.info("No validation decisions recorded for this run.")
        return
    shown = vals.drop(columns=["candidate_id", "suite_version"])
    grid(shown, hide_index=True, key="run_decisions")
    st.caption(f"Suite version(s): {', '.join(code(v) for v in sorted(vals['suite_version'].dropna().unique()))}")
    flagged = vals[vals["verdict"] != "accept"]
    if not flagged.empty:
        st.markdown("**Evidence of the decisions that did not accept**")
        for row in flagged.itertuples():
            with st.expander(f"Step {row.step}.{row.attempt} · {code(row.validator)} → {row.verdict} "
                             f"({code(row.code)})"):
                st.markdown(code(row.message))
                st.json(_json(row.evidence_json), expanded=2)


def _label_form(detail: dict, run_id: str) -> None:
    vals, cands = detail["validations"], detail["candidates"]
    st.markdown("**Label a decision**: what should the verdict have been?")
    saved = st.session_state.pop("label_saved", None)
    if saved:
        st.success(saved)
    if cands.empty:
        st.info("This run has no candidates to label.")
        return
    why = no_journal(home(), store_url())
    if why:
        st.info(why)  # said before anyone fills the form in, not after Save
        return
    # Every candidate as a whole (an imported run may have no recorded
    # decision yet: a replay will judge it), then each recorded decision.
    whole = cands[["step", "attempt", "candidate_id"]].drop_duplicates().assign(validator="", verdict="")
    keys = (vals[["step", "attempt", "candidate_id", "validator", "verdict"]].drop_duplicates()
            if not vals.empty else whole.iloc[0:0])
    options = pd.concat([whole, keys], ignore_index=True)

    def describe(i: int) -> str:
        r = options.iloc[i]
        who = r["validator"] or "(the candidate as a whole)"
        now = f" — recorded {r['verdict']}" if r["verdict"] else ""
        return f"step {r['step']}.{r['attempt']} · {who}{now}"

    # The form's widgets belong to this run, and are made afresh after each
    # save (the count in their keys): a choice made on another run's page is
    # never carried over, and a second click on Save sends the same label
    # again (written once), never a cleared form.
    fresh = st.session_state.setdefault("label_forms_saved", 0)
    form = f"label_form:{run_id}:{fresh}"
    # Nothing is chosen until a person chooses it, and Enter in the note
    # does not send the form: a label is a person's word, never a default.
    with st.form(form, enter_to_submit=False):
        picked = st.selectbox("Decision", range(len(options)), format_func=describe, key=f"{form}:pick",
                              index=None, placeholder="Pick the decision to label")
        verdict = st.radio("Expected verdict", VERDICTS, horizontal=True, key=f"{form}:verdict", index=None)
        note = st.text_input("Note", key=f"{form}:note")
        submitted = st.form_submit_button("Save label")
    if submitted and (picked is None or verdict is None):
        st.warning("Pick " + " and ".join(what for what, value in (("the decision", picked), ("the expected verdict",
                                                                                           verdict)) if value is None)
                   + " first; nothing was saved.")
    elif submitted:
        r = options.iloc[int(picked)]
        let_exports_in()  # the label is exported at once
        try:
            label_id = add_human_label(home(), run_id=run_id, step=int(r["step"]), attempt=int(r["attempt"]),
                                       candidate_id=str(r["candidate_id"]), validator=str(r["validator"]),
                                       expected_verdict=verdict, note=note, store_url=store_url())
        except DataError as exc:
            st.error(str(exc))
            return
        st.cache_data.clear()  # the exported labels segment is a new file, but other sessions cache too
        # Shown again after the rerun that lists the new label above.
        st.session_state["label_saved"] = f"Saved label {label_id}: {describe(int(picked)).split(' — ')[0]} → {verdict}"
        st.session_state["label_forms_saved"] = fresh + 1
        st.rerun()


def _unreadable(detail: dict, section: str) -> bool:
    """Say so, in this tab only, when the section's table cannot be read."""
    why = detail["errors"].get(section)
    if why:
        st.error(why)
    return bool(why)


def _body() -> None:
    run_id = st.query_params.get("run_id", "").strip()  # a pasted id often brings a space along
    if not run_id and st.session_state.get("last_run_id"):
        # Back to the Run page from the sidebar: the run last looked at.
        run_id = st.session_state["last_run_id"]
        st.query_params["run_id"] = run_id
    typed = st.text_input("Run id", value=run_id,
                          help="Or open a run from the Runs page; this page's address links to the run.").strip()
    if typed != run_id:
        st.query_params["run_id"] = typed
        run_id = typed
    if not run_id:
        st.info("Pick a run on the Runs page, or type its id above.")
        return
    detail = load(q.run_detail, run_id)
    if detail is None:
        st.warning(f"No run {code(run_id)} in these traces.")
        return
    run = detail["run"]
    st.session_state["last_run_id"] = run_id
    st.subheader(f"Run {code(run_id)}")
    _header(run, detail["spans"])
    if not _unreadable(detail, "events"):
        _timeline(detail["spans"])
    tabs = st.tabs(["Candidates", "Decisions", "Operations", "Waits & replies", "Loop diagnosis", "Labels",
                    "Events"])
    with tabs[0]:
        if not _unreadable(detail, "candidates"):
            _candidates(detail, run_id)
    with tabs[1]:
        if not _unreadable(detail, "validations"):
            _decisions(detail)
    with tabs[2]:
        ops = detail["operations"]
        if _unreadable(detail, "operations"):
            pass
        elif ops.empty:
            st.info("No tool operations in this run.")
        else:
            grid(ops, hide_index=True, key="run_ops")
        st.markdown("**Reconciliation and background work**")
        rec = q.reconciliation(detail["events"])
        if _unreadable(detail, "events"):
            pass
        elif rec.empty:
            st.caption("No unknown outcomes, refusals or background completions.")
        else:
            grid(times(rec, "ts"), hide_index=True, key="run_reconcile")
    with tabs[3]:
        waits = q.waits(detail["events"])
        if _unreadable(detail, "events"):
            pass
        elif waits.empty:
            st.info("This run never waited on a user or a tool.")
        else:
            grid(times(waits, "ts"), hide_index=True, key="run_waits")
    with tabs[4]:
        diag = detail["diagnoses"]
        if _unreadable(detail, "diagnoses"):
            pass
        elif unreadable := load(q.unreadable_tables).get("loop_diagnoses"):
            st.error(f"{unreadable}.")
        elif diag.empty:
            st.info("No loop diagnosis for this run.")
        for row in diag.itertuples():
            st.markdown(f"**Detector** {code(row.detector)} ({code(row.detector_version)}) · pattern "
                        f"{code(row.pattern)} · step {row.step}")
            st.json(_json(row.evidence_json), expanded=2)
    with tabs[5]:
        labels = detail["labels"]
        if _unreadable(detail, "labels"):
            pass
        elif labels.empty:
            st.caption("No labels for this run yet.")
        else:
            grid(times(labels, "created_at"), hide_index=True, key="run_labels")
        _label_form(detail, run_id)
    with tabs[6]:
        if not _unreadable(detail, "events"):
            grid(times(detail["events"], "ts"), hide_index=True, key="run_events")


def render() -> None:
    guarded("Run", _body)


if __name__ == "__main__":
    render()
