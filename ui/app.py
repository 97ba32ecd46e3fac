"""The workbench's entry script: ``streamlit run app.py`` (what ``loopledger
ui`` starts). The data directory comes from ``$LOOPLEDGER_HOME``.

Each page is a script beside this one; ``?run_id=`` on the root address
opens the Run page directly, so a run's link can be shared.
"""

from __future__ import annotations

import streamlit as st

from loopledger.ui._st import home

st.set_page_config(page_title="loopledger workbench", page_icon=":material/loop:", layout="wide")

deep_link = "run_id" in st.query_params
pages = [
    st.Page("_pages_overview.py", title="Overview", icon=":material/dashboard:", url_path="overview", default=not deep_link),
    st.Page("_pages_runs.py", title="Runs", icon=":material/table_rows:", url_path="runs"),
    st.Page("_pages_run.py", title="Run", icon=":material/timeline:", url_path="run", default=deep_link),
    st.Page("_pages_diagnoses.py", title="Loop diagnoses", icon=":material/loop:", url_path="diagnoses"),
    st.Page("_pages_validators.py", title="Compare validators", icon=":material/compare_arrows:", url_path="compare-validators"),
    st.Page("_pages_prompts.py", title="Compare prompt versions", icon=":material/difference:", url_path="compare-prompts"),
    st.Page("_pages_labels.py", title="Labels", icon=":material/label:", url_path="labels"),
]
page = st.navigation(pages)
try:
    st.sidebar.caption(f"Data directory: `{home()}`")
except Exception as exc:  # noqa: BLE001 - the pages say what is wrong in full
    st.sidebar.caption(f"Data directory: {exc}")
page.run()
