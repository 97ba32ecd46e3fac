"""Writing a human label: the one thing the workbench writes.

The journal's ``labels`` table is the source of truth; the Parquet
``labels`` table is refreshed by the engine's normal recorder right after,
so the UI never writes Parquet (or any other journal table) itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._data import VERDICTS, DataError


def no_journal(home: Path, store_url: str | None = None) -> str | None:
    """Why no label can be written here (a data directory of traces only), or None."""
    from loopledger.engine import Home

    where = Home(Path(home), store_url)
    if where.has_journal:
        return None
    return (f"No journal at {where.journal_path}: labels are written to the run journal, which this data "
            "directory does not have (its traces were copied or imported without one). Label the run where "
            "its journal is.")


def add_human_label(home: Path, *, run_id: str, step: int, attempt: int, candidate_id: str,
                    validator: str, expected_verdict: str, note: str = "", store_url: str | None = None) -> int:
    """Record the label in the journal (``store_url``, else the SQLite
    journal in ``home``), export it; return its label_id."""
    from loopledger.engine import Home, JournalError, Recorder

    if expected_verdict not in VERDICTS:
        raise DataError(f"expected verdict must be one of {', '.join(VERDICTS)}, not {expected_verdict!r}")
    where = Home(Path(home), store_url)
    missing = no_journal(home, store_url)
    if missing:
        # Opening the store would create an empty journal: traces imported
        # without one cannot take labels through the recorder.
        raise DataError(missing)
    try:
        store = where.open_store()
    except JournalError as exc:
        raise DataError(f"The journal cannot take the label: {exc}") from None
    try:
        try:
            # Before the label is written: traces another journal exported
            # (copied from elsewhere) would never get it, nor a replay see it.
            Recorder(store, where.traces).claim()
        except JournalError as exc:
            # Another journal's traces (label them where that journal is), or
            # a damaged marker: the recorder's own words say which.
            raise DataError(f"The label cannot be written: {exc}.") from None
        label: dict[str, Any] = {
            "run_id": run_id, "step": int(step), "attempt": int(attempt), "candidate_id": candidate_id,
            "validator": validator, "expected_verdict": expected_verdict, "source": "human", "note": note,
        }
        key, rest = ("step", "attempt", "validator"), ("candidate_id", "expected_verdict", "source", "note")
        latest = [row for row in store.labels(run_id) if all(row[k] == label[k] for k in key)]
        if latest and all(latest[-1][k] == label[k] for k in rest):
            # The same label again (a second click on Save): it is already
            # the one that counts; nothing new to write.
            return int(latest[-1]["label_id"])
        label_id = store.add_label(label)
        Recorder(store, where.traces).export()
    finally:
        store.close()
    return label_id
