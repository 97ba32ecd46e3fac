"""Fixtures shared by every test folder.

``postgres_url`` is a new, empty database on a real PostgreSQL server that
the session starts (tests/postgres_kit.py). Without the server's binaries
the tests that need it are skipped, unless ``LOOPLEDGER_REQUIRE_POSTGRES``
is set (``make test`` sets it, so CI never skips them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import postgres_kit


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres_kit.Server]:
    url = os.environ.get("LOOPLEDGER_TEST_POSTGRES")
    if url:
        yield postgres_kit.external_server(url)
        return
    bin_dir = postgres_kit.find_bin_dir()
    if bin_dir is None:
        message = "no PostgreSQL server binaries (initdb, pg_ctl); `make test` installs them"
        if os.environ.get("LOOPLEDGER_REQUIRE_POSTGRES"):
            pytest.fail(message)
        pytest.skip(message)
    server = postgres_kit.LocalServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: postgres_kit.Server) -> str:
    return postgres_server.new_database()
