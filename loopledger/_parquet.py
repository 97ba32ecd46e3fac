"""Finding the broken file among many: DuckDB says what went wrong when a
scan fails, not always in which file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


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
