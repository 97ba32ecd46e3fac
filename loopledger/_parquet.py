"""Finding the broken file among many: DuckDB says what went wrong when a
scan fails, not always in which file."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

#: The file an export writes into the traces folder it fills (the id of the
#: journal its rows come from).
TRACES_MARKER = ".journal"


def one_line(exc: BaseException) -> str:
    """An error's type and message, on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def first_unreadable(files: Iterable[Path]) -> tuple[Path, str] | None:
    """The first of ``files`` whose footer or data pages cannot be read, and why."""
    import pyarrow.parquet as pq

    for path in files:
        try:
            for _ in pq.ParquetFile(path).iter_batches(batch_size=65_536):
                pass
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a broken file
            return path, one_line(exc)
    return None


def repair_hint(path: Path) -> str:
    """What to do about an unreadable file of a traces folder an export
    fills (``<home>/traces/<table>/<file>``): its journal can write it
    again, from the data directory when the journal is there, else from
    wherever it is (a copy of the folder, a server's journal). Empty for
    any other folder."""
    traces = path.parent.parent
    if not (traces / TRACES_MARKER).is_file():
        return ""
    if traces.name == "traces" and (traces.parent / "journal.sqlite").is_file():
        return (f"; `loopledger export --repair --home {shlex.quote(str(traces.parent))}` writes it again from "
                "the journal")
    return ("; `loopledger export --repair` on the journal that exported this folder (its --home, or --store for "
            "a server's) writes it again; no journal.sqlite is beside the folder")
