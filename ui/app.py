"""The workbench's entry script: ``streamlit run app.py`` (what ``loopledger
ui`` starts). The data directory comes from ``$LOOPLEDGER_HOME``.

Each page is a script beside this one, at its own address (the Overview
at the root); ``/run?run_id=ID``, or ``?run_id=ID`` on the root address,
opens a run's page, so a run's link can be shared.
"""

from __future__ import annotations

import streamlit as st

from loopledger.ui._st import home

st.set_page_config(page_title="loopledger workbench", page_icon="🔁", layout="wide")

# The default page is served at the root address (its url_path is not
# used); every other page keeps its own address, /run included.
overview = st.Page("_pages_overview.py", title="Overview", icon=":material/dashboard:", default=True)
run_page = st.Page("_pages_run.py", title="Run", icon=":material/timeline:", url_path="run")
pages = [
    overview,
    st.Page("_pages_runs.py", title="Runs", icon=":material/table_rows:", url_path="runs"),
    run_page,
    st.Page("_pages_diagnoses.py", title="Loop diagnoses", icon=":material/loop:", url_path="diagnoses"),
    st.Page("_pages_validators.py", title="Compare validators", icon=":material/compare_arrows:", url_path="compare-validators"),
    st.Page("_pages_prompts.py", title="Compare prompt versions", icon=":material/difference:", url_path="compare-prompts"),
    st.Page("_pages_labels.py", title="Labels", icon=":material/label:", url_path="labels"),
]
page = st.navigation(pages)
if page is overview and "run_id" in st.query_params:
    # /?run_id=ID, a run's shared address: its Run page.
    st.switch_page(run_page, query_params={"run_id": st.query_params["run_id"]})
elif page is not run_page and "run_id" in st.query_params:
    # A run's id carried to another page (the browser's Back from a run):
    # it means nothing there, and would make that page's address a run's.
    del st.query_params["run_id"]
try:
    st.sidebar.caption(f"Data directory: `{home()}`")
except Exception as exc:  # noqa: BLE001 - the pages say what is wrong in full
    st.sidebar.caption(f"Data directory: {exc}")
page.run()
