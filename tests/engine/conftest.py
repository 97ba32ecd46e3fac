"""Fixtures shared by the engine tests.

``store`` is parametrised over the journal backends (``STORE_KINDS``), so
every test that takes it is part of the store conformance suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from journal_kit import STORE_KINDS, Runs, open_store, raw_connection


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def journal_at(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str | Path:
    """Where the test's journal is: a file, or a new PostgreSQL database."""
    if store_kind == "postgresql":
        return request.getfixturevalue("postgres_url")
    return tmp_path / "journal.sqlite"


@pytest.fixture
def store(store_kind: str, journal_at: str | Path) -> Iterator[Any]:
    opened = open_store(store_kind, journal_at)
    yield opened
    opened.close()


@pytest.fixture
def raw(store: Any, store_kind: str, journal_at: str | Path) -> Iterator[Any]:
    conn = raw_connection(store_kind, journal_at)
    yield conn
    conn.close()


@pytest.fixture
def runs(store: Any) -> Runs:
    return Runs(store)
