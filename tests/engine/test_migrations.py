"""Versioned migrations of the SQLite journal: fresh, upgrade from an older
version (a checked-in dump), concurrent, failing and edited migrations."""

from __future__ import annotations

import hashlib
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

import loopledger.engine
from journal_kit import migrate_worker
from loopledger.engine import (
    Artifact,
    Commit,
    JournalError,
    MigrationError,
    NewEvent,
    Recorder,
    SQLiteRunStore,
    State,
)
from loopledger.engine import _migrate

MIGRATIONS_DIR = Path(loopledger.engine.__file__).parent / "migrations" / "sqlite"
FIXTURE = Path(__file__).parent / "fixtures" / "journal_v1.sql"

JOURNAL_TABLES = {
    "runs", "run_specs", "events", "artifacts", "candidates", "validations", "operations", "loop_diagnoses", "labels",
    "export_marks", "exports", "compactions", "journal_identity", "schema_migrations",
}


def migration_files() -> list[Path]:
    return sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql"))


def latest() -> int:
    return len(migration_files())


def applied(path: Path) -> list[tuple[int, str, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT version, name, checksum FROM schema_migrations ORDER BY version").fetchall()
    finally:
        conn.close()


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not name.startswith("sqlite_")
        }
    finally:
        conn.close()


def test_migration_files_are_numbered_from_one_without_gaps() -> None:
    numbers = [int(p.name[:4]) for p in migration_files()]
    assert numbers == list(range(1, len(numbers) + 1))
    assert [m.version for m in _migrate.load_migrations("sqlite")] == numbers


def test_a_fresh_journal_reaches_the_latest_version(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    store = SQLiteRunStore(path)
    assert store.schema_version == latest()
    store.close()
    expected = [
        (int(p.name[:4]), p.stem[5:], hashlib.sha256(p.read_text("utf-8").encode("utf-8")).hexdigest())
        for p in migration_files()
    ]
    assert applied(path) == expected
    assert tables(path) == JOURNAL_TABLES

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    before = conn.execute("SELECT * FROM schema_migrations").fetchall()
    conn.close()
    # Opening again applies nothing.
    SQLiteRunStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT * FROM schema_migrations").fetchall() == before
    conn.close()


def test_migrate_to_stops_at_a_version(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    store = SQLiteRunStore(path, migrate_to=1)
    assert store.schema_version == 1
    store.close()
    assert [v for v, _, _ in applied(path)] == [1]
    assert tables(path) == {"runs", "events", "artifacts", "schema_migrations"}
    store = SQLiteRunStore(path)
    assert store.schema_version == latest()
    store.close()


def load_fixture(tmp_path: Path) -> Path:
    path = tmp_path / "journal.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(FIXTURE.read_text("utf-8"))
    conn.close()
    return path


def test_the_fixture_is_a_version_1_journal(tmp_path: Path) -> None:
    path = load_fixture(tmp_path)
    assert [v for v, _, _ in applied(path)] == [1]
    assert "candidates" not in tables(path)


def test_upgrade_from_version_1_keeps_the_data(tmp_path: Path) -> None:
    path = load_fixture(tmp_path)
    store = SQLiteRunStore(path)
    assert store.schema_version == latest()
    assert [v for v, _, _ in applied(path)] == list(range(1, latest() + 1))
    assert tables(path) == JOURNAL_TABLES

    run = store.get_run("run-v1")
    assert (run.task_id, run.tenant, run.prompt_version, run.model_route) == (
        "refund-after-timeout", "acme", "v1", "scripted",
    )
    assert (run.state, run.state_version, run.last_seq, run.step, run.attempt) == (State.VALIDATING, 3, 4, 1, 1)
    assert run.spec == {"contract": {"goal": "Refund order ORD-1042 in full"}}
    assert run.started_at == 1767323045000000  # 2026-01-02T03:04:05Z
    events = store.events("run-v1")
    assert [(e.seq, e.kind, e.from_state, e.to_state, e.state_version) for e in events] == [
        (1, "run_created", None, "READY", 1),
        (2, "transition", "READY", "MODEL_RUNNING", 2),
        (3, "model_delta", "MODEL_RUNNING", None, 2),
        (4, "transition", "MODEL_RUNNING", "VALIDATING", 3),
    ]
    assert events[2].payload == {"text": "Looking up the order"}
    assert store.get_artifact(Artifact("context", {"messages": [{"role": "user", "content": "Refund ORD-1042"}]}).artifact_id) == {
        "messages": [{"role": "user", "content": "Refund ORD-1042"}]
    }

    # The upgraded journal works like a new one: commits with facts, and export.
    store.commit(Commit(
        run_id="run-v1", expected_version=3, to_state=State.READY,
        events=(NewEvent("after_upgrade"),),
        facts={"validations": ({
            "step": 1, "attempt": 1, "candidate_id": "c", "validator": "structure", "validator_version": "1",
            "suite_version": "s", "verdict": "repair", "code": "x", "message": "", "evidence_json": {},
        },)},
    ))
    assert [e.seq for e in store.events("run-v1")] == [1, 2, 3, 4, 5, 6]
    result = Recorder(store, tmp_path / "traces").export()
    assert result.rows["events"] == 6 and result.rows["validations"] == 1 and result.rows["artifacts"] == 2
    store.close()


@pytest.mark.slow
def test_processes_migrating_the_same_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers = 4
    for attempt in range(3):
        path = tmp_path / f"journal-{attempt}.sqlite"
        barrier = ctx.Barrier(workers, timeout=120)
        procs = [ctx.Process(target=migrate_worker, args=(str(path), barrier)) for _ in range(workers)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
        assert [proc.exitcode for proc in procs] == [0] * workers
        assert [v for v, _, _ in applied(path)] == list(range(1, latest() + 1))
        assert tables(path) == JOURNAL_TABLES


def with_extra(monkeypatch: pytest.MonkeyPatch, *extra: _migrate.Migration) -> None:
    real = _migrate.load_migrations("sqlite")
    monkeypatch.setattr(_migrate, "load_migrations", lambda dialect, package="loopledger.engine": [*real, *extra])


BROKEN = [
    pytest.param(
        "CREATE TABLE half_done (x INTEGER);\nINSERT INTO half_done VALUES (1);\nCREATE TABLE broken (;\n",
        id="syntax-error",
    ),
    pytest.param(
        "CREATE TABLE half_done (x INTEGER);\n"
        "UPDATE runs SET tenant = 'changed';\n"
        "INSERT INTO no_such_table VALUES (1);\n",
        id="runtime-error",
    ),
]


@pytest.mark.parametrize("sql", BROKEN)
def test_a_failing_migration_leaves_the_version_and_the_tables_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str
) -> None:
    path = load_fixture(tmp_path)
    SQLiteRunStore(path).close()
    before_tables = tables(path)
    with_extra(monkeypatch, _migrate.Migration(latest() + 1, "broken", sql))

    with pytest.raises(MigrationError) as caught:
        SQLiteRunStore(path)
    assert isinstance(caught.value, JournalError)
    assert (caught.value.version, caught.value.name) == (latest() + 1, "broken")
    assert "broken" in str(caught.value)

    assert [v for v, _, _ in applied(path)] == list(range(1, latest() + 1))
    assert tables(path) == before_tables
    monkeypatch.undo()
    store = SQLiteRunStore(path)  # not left locked, data intact
    assert store.get_run("run-v1").tenant == "acme"
    store.close()


def test_a_failing_migration_on_a_fresh_file_keeps_the_ones_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal.sqlite"
    with_extra(monkeypatch, _migrate.Migration(latest() + 1, "broken", "CREATE TABLE half_done (x);\nSELEC 1;\n"))
    with pytest.raises(MigrationError):
        SQLiteRunStore(path)
    assert [v for v, _, _ in applied(path)] == list(range(1, latest() + 1))
    assert "half_done" not in tables(path)


def test_an_edited_applied_migration_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal.sqlite"
    SQLiteRunStore(path).close()
    edited = [
        _migrate.Migration(m.version, m.name, m.sql + "\n-- edited after it was applied\n") if m.version == 2 else m
        for m in _migrate.load_migrations("sqlite")
    ]
    monkeypatch.setattr(_migrate, "load_migrations", lambda dialect, package="loopledger.engine": edited)
    with pytest.raises(MigrationError) as caught:
        SQLiteRunStore(path)
    assert caught.value.version == 2
    assert "changed" in str(caught.value)


def test_a_journal_migrated_by_a_newer_loopledger_is_refused_and_not_written(tmp_path: Path) -> None:
    """Its tables may have changed in ways this version would misread or
    damage: one error naming the journal and both versions (exit 3 from the
    commands), and the file is left as it was."""
    from loopledger.engine._errors import JournalTooNew

    path = tmp_path / "journal.sqlite"
    SQLiteRunStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_migrations VALUES (?, 'from_the_future', 'x', 0)", (latest() + 1,))
    conn.commit()
    conn.close()
    before = _journal_files(tmp_path)
    with pytest.raises(JournalTooNew) as caught:
        SQLiteRunStore(path)
    assert (caught.value.found, caught.value.known) == (latest() + 1, latest())
    assert str(caught.value).startswith(f"{path}: its schema is at version {latest() + 1}, newer than")
    assert isinstance(caught.value, JournalError)
    assert _journal_files(tmp_path) == before


def test_load_migrations_refuses_a_gap_and_ignores_other_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fake_migrations_pkg"
    folder = package / "migrations" / "sqlite"
    folder.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (folder / "0001_first.sql").write_text("CREATE TABLE a (x);\n")
    (folder / "README.md").write_text("not a migration")
    (folder / "0002_second.sql").write_text("CREATE TABLE b (x);\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _migrate.load_migrations("sqlite", package="fake_migrations_pkg")
    assert [(m.version, m.name) for m in found] == [(1, "first"), (2, "second")]

    (folder / "0004_fourth.sql").write_text("CREATE TABLE d (x);\n")
    with pytest.raises(MigrationError) as caught:
        _migrate.load_migrations("sqlite", package="fake_migrations_pkg")
    assert caught.value.version == 4


def _journal_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_journal_opened_to_read_only_is_read_and_never_written(tmp_path: Path) -> None:
    """For a data directory this process may not write (an archive): the
    journal reads as usual, nothing beside it appears or changes, and a
    commit through it fails without touching the file."""
    from journal_kit import Runs

    path = tmp_path / "journal.sqlite"
    store = SQLiteRunStore(path)
    Runs(store).drive_to(Runs(store).new("run-ro").run_id, State.TOOL_RUNNING)
    store.close()
    before = _journal_files(tmp_path)
    assert sorted(before) == ["journal.sqlite"], "a clean close leaves the journal alone"

    reader = SQLiteRunStore(path, read_only=True)
    try:
        assert reader.get_run("run-ro").state is State.TOOL_RUNNING
        assert [e.seq for e in reader.events("run-ro")] == list(range(1, len(reader.events("run-ro")) + 1))
        version = reader.get_run("run-ro").state_version
        with pytest.raises(Exception, match="readonly|read only|read-only"):
            reader.commit(Commit(run_id="run-ro", expected_version=version, to_state=State.READY))
        with pytest.raises(JournalError, match="read only"):
            reader.claim("run-ro")
    finally:
        reader.close()
    assert _journal_files(tmp_path) == before


def test_a_journal_opened_to_read_only_must_be_at_the_newest_schema(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    SQLiteRunStore(path, migrate_to=1).close()
    with pytest.raises(JournalError, match=rf"schema version 1, this loopledger reads {latest()}; open it once"):
        SQLiteRunStore(path, read_only=True)
    with pytest.raises(JournalError, match="no journal to read"):
        SQLiteRunStore(tmp_path / "none.sqlite", read_only=True)
    assert not (tmp_path / "none.sqlite").exists()


def test_show_reads_a_data_directory_it_may_not_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Home.open_store(to_read=True)``, which ``show`` uses, opens a journal
    this process may not write read-only (the check is the OS's own
    ``access``; faked here, since the tests may run as root)."""
    import os

    from journal_kit import Runs
    from loopledger.engine import Home

    home = Home(tmp_path / "home")
    store = home.open_store()
    Runs(store).new("run-a")
    store.close()
    before = _journal_files(home.root)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK else real_access(p, mode))
    reader = home.open_store(to_read=True)
    try:
        assert reader.read_only and reader.get_run("run-a").run_id == "run-a"
    finally:
        reader.close()
    assert _journal_files(home.root) == before
    monkeypatch.setattr(os, "access", real_access)
    writer = home.open_store(to_read=True)
    assert not writer.read_only
    writer.close()
