"""What every page shares: the data directory, cached loading, the error
guard, pagination and links to runs. Imported only inside Streamlit."""

from __future__ import annotations

import html
import importlib
import math
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import streamlit as st

from loopledger._text import visible

from ._data import DataError, NoData, Traces, fingerprint

RUN_PAGE = "_pages_run.py"
HOME_ENV = "LOOPLEDGER_HOME"  # `loopledger ui --home` passes the directory this way
STORE_ENV = "LOOPLEDGER_STORE"  # ... and `--store`, the journal that takes labels


def store_url() -> str | None:
    """The journal URL ``loopledger ui --store`` was given, if any."""
    import os

    return os.environ.get(STORE_ENV) or None


def home() -> Path:
    """The data directory: ``$LOOPLEDGER_HOME``, else ``./loopledger-data``."""
    from loopledger.engine._errors import BadInput
    from loopledger.engine._home import Home

    try:
        return Home.resolve(None).root.resolve()
    except BadInput as exc:
        raise DataError(str(exc)) from None


@st.cache_data(show_spinner=False, max_entries=512)
def _cached(module: str, name: str, root: str, stamp: str, args: tuple[Any, ...],
            kwargs: tuple[tuple[str, Any], ...]) -> Any:
    # ``stamp`` is only part of the key: a new, removed or rewritten Parquet
    # file changes it, so a cached result never outlives the files it read.
    del stamp
    from loopledger.engine._recorder import ReadLock

    fn = getattr(importlib.import_module(module), name)
    # Files listed and read under the export lock (shared): an export or a
    # compaction publishing meanwhile waits, so a page never counts one
    # table's new rows without the others', nor reads a file being removed.
    reading = ReadLock(Path(root) / "traces")
    try:
        traces = Traces(Path(root))
        try:
            return fn(traces, *args, **dict(kwargs))
        finally:
            traces.close()
    finally:
        reading.release()


def load(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(Traces(home), *args, **kwargs)``, cached until the files change."""
    root = home()
    return _cached(fn.__module__, fn.__name__, str(root), fingerprint(root), args, tuple(sorted(kwargs.items())))


def traces() -> Traces:
    """An uncached view of the directory, for the cheap questions (which tables exist)."""
    return Traces(home())


#: The page being drawn in this thread (Streamlit runs each session's script
#: in a thread of its own): its hold on the traces' export lock.
_page = threading.local()


def let_exports_in() -> None:
    """Let go of the page's hold on the export lock, before the page itself
    exports (a label saved): its export would wait for the page for ever."""
    reading = getattr(_page, "reading", None)
    if reading is not None:
        reading.release()


def guarded(title: str, body: Callable[[], None]) -> None:
    """Render a page; missing or unreadable data becomes a message in the
    page, never a traceback."""
    st.title(title)
    from loopledger.engine._recorder import ReadLock

    reading = None
    try:
        # One set of files for the whole page: every figure on it comes from
        # the same export (one published meanwhile waits for the page).
        reading = _page.reading = ReadLock(home() / "traces")
        body()
    except NoData as exc:
        st.info(str(exc))
    except DataError as exc:
        st.error(str(exc))
    except Exception as exc:  # noqa: BLE001 - the last line of defence of a page
        st.error(f"This page could not be shown: {type(exc).__name__}: {exc}")
    finally:
        _page.reading = None
        if reading is not None:
            reading.release()


_REMEMBERED = "_remembered"


def remember(key: str, options: Sequence[Any] | None = None, default: Any = None) -> str:
    """``key``, for a widget whose value outlives a visit to another page.

    Streamlit forgets a widget's value once a run of another page does not
    draw it: opening a run and coming Back left the Runs page with no
    filters. Each run of the page copies the value under a key of this
    module's, and a run that finds the widget's own key gone puts the copy
    back. A value no longer among ``options`` is let go (a multiselect keeps
    those that are), and ``default`` is set when there is none (a widget
    whose value comes from Session State takes no ``index`` or ``value``).
    """
    kept = st.session_state.setdefault(_REMEMBERED, {})
    if key in st.session_state:
        kept[key] = st.session_state[key]
    elif key in kept:
        st.session_state[key] = kept[key]
    if options is not None and key in st.session_state:
        value = st.session_state[key]
        if isinstance(value, list):
            st.session_state[key] = [v for v in value if v in options]
        elif value not in options:
            del st.session_state[key]
    if default is not None and key not in st.session_state:
        st.session_state[key] = default
    return key


def pager(total: int, key: str, sizes: tuple[int, ...] = (25, 50, 100, 200), noun: str = "rows",
          reset_on: Any = None) -> tuple[int, int]:
    """Page controls; returns (offset, limit). The page goes back to the
    first when ``reset_on`` (the filters and the order) changes, and is
    clamped when the result shrinks."""
    left, right, info = st.columns([1, 1, 3])
    size = left.selectbox("Rows per page", sizes, key=remember(f"{key}_size", sizes, sizes[min(1, len(sizes) - 1)]))
    pages = max(1, math.ceil(total / size))
    page_key = remember(f"{key}_page")
    if st.session_state.get(f"{key}_for") != reset_on:
        st.session_state[f"{key}_for"] = reset_on
        st.session_state[page_key] = 1
    if st.session_state.get(page_key, 1) > pages:
        st.session_state[page_key] = pages
    remember(page_key)  # as set here, should the next run be another page's
    page = right.number_input("Page", min_value=1, max_value=pages, step=1, key=page_key)
    offset = (int(page) - 1) * size
    shown = f"{offset + 1}–{min(offset + size, total)}" if total else "0"
    info.markdown(f"Showing **{shown}** of **{total:,}** {noun}")
    return offset, size


def times(frame: Any, *columns: str) -> Any:
    """``frame`` with its timestamp ``columns`` as text to the millisecond,
    in UTC (the grid shows whole seconds, and its column formats do not
    reach its accessible table: every event of a run read the same time).
    ISO order, so sorting the text sorts the times."""
    import pandas as pd

    shown = frame.copy()
    for c in columns:
        if c in shown.columns:
            values = pd.to_datetime(shown[c], utc=True)
            shown[c] = [None if pd.isna(v) else v.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] for v in values]
    return shown


def grid(frame: Any, **kwargs: Any) -> Any:
    """``st.dataframe`` of ``frame`` with its text shown as written: control
    characters (a NUL, an escape sequence in an imported task id or model
    name) written out, as the page's other text has them."""
    import pandas as pd

    shown = frame.copy()
    for column in shown.columns:
        if pd.api.types.is_string_dtype(shown[column].dtype):  # text, or objects that may be text
            shown[column] = shown[column].map(lambda v: visible(v) if isinstance(v, str) else v)
    return st.dataframe(shown, **kwargs)


def run_url(run_id: str) -> str:
    return f"run?run_id={quote(run_id, safe='')}"


def run_link_column(label: str = "run") -> Any:
    return st.column_config.LinkColumn(label, display_text=r"run\?run_id=(.*)")


def open_run_picker(run_ids: list[str], key: str) -> None:
    """A select box and button that open one of ``run_ids`` on the Run page
    (the link column opens a new tab; this stays in the tab)."""
    if not run_ids:
        return
    left, right = st.columns([4, 1])
    chosen = left.selectbox("Open a run", run_ids, key=f"{key}_pick")
    right.write("")  # aligns the button with the select box's input
    if right.button("Open run", key=f"{key}_open"):
        st.switch_page(RUN_PAGE, query_params={"run_id": chosen})


def missing(value: Any) -> bool:
    """No figure: None, or the NaN pandas holds for a null (an imported
    run's usage its source does not give, and the sums and means of it)."""
    return value is None or value != value


def code(value: Any) -> str:
    """Recorded text (a task id, a model's name, a validator's message) as
    an inline code span for Markdown, shown exactly as written: a fence
    longer than any run of backticks in it, control characters and line
    breaks written out (a line break would let a ``- item`` or ``# title``
    after it start a block), so nothing in it is read as Markdown, HTML or
    maths. Empty or missing text is a dash."""
    text = "" if missing(value) else str(value)
    text = visible(text).replace("\n", "\\n").replace("\t", "\\t")
    if not text.strip():
        return "—" if not text else f"`{text}`"
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_BACKTICKS = re.compile("`+")


def chart_text(frame: Any, *columns: str) -> Any:
    """A copy of ``frame`` whose text ``columns`` plotly draws as written:
    its axis ticks, legends and facet titles read a subset of HTML (``<b>``
    would turn a model named ``<b>m</b>`` bold), so ``&``, ``<`` and ``>``
    become entities, which it draws as the characters."""
    out = frame.copy()
    for column in columns:
        if column in out.columns:
            out[column] = out[column].map(lambda v: chart_label(v) if isinstance(v, str) else v)
    return out


def chart_label(text: str) -> str:
    """One label of a chart (see :func:`chart_text`)."""
    return html.escape(visible(text), quote=False)


def replay_named() -> Callable[[str], str]:
    """How a picker shows a side or a source: a replay with the suite it
    ran (``r2026... · suite strict``), anything else as it is."""
    from . import _compare

    summaries = load(_compare.replay_summaries)
    suites = ({str(r.replay_dir): str(r.suite_name) for r in summaries.itertuples()}
              if "suite_name" in summaries.columns else {})
    return lambda side: f"{side} · suite {suites[side]}" if suites.get(side) else side


def left_out(table: str, what: str) -> bool:
    """Whether ``table`` (one of ``SECONDARY_TABLES``) could not be read;
    if so, say it once on the page, with what the page leaves out."""
    from . import _queries

    why = load(_queries.unreadable_tables).get(table)
    if why:
        st.warning(f"{why}. {what}")
    return bool(why)


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"
