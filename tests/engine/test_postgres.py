"""What is particular to the PostgreSQL journal: its migrations, its schema
against SQLite's, and its connection errors. (Everything the two stores
share is in the conformance suite: test_store, test_states, test_recorder,
test_concurrency and test_crash run on both.)"""

from __future__ import annotations

import hashlib
import multiprocessing
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import loopledger.engine
from journal_kit import migrate_worker, raw_connection
from loopledger.engine import (
    Artifact,
    BadInput,
    Commit,
    Home,
    JournalError,
    MigrationError,
    NewRun,
    PostgresRunStore,
    SQLiteRunStore,
    State,
    open_journal,
)
from loopledger.engine import _migrate, _store

MIGRATIONS = Path(loopledger.engine.__file__).parent / "migrations"


def applied(url: str) -> list[tuple[int, str, str]]:
    conn = raw_connection("postgresql", url)
    try:
        return [tuple(r) for r in conn.execute("SELECT version, name, checksum FROM schema_migrations ORDER BY version")]
    finally:
        conn.close()


def columns_pg(url: str) -> dict[str, set[str]]:
    conn = raw_connection("postgresql", url)
    try:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'"
        ).fetchall()
    finally:
        conn.close()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    return found


def columns_sqlite(path: Path) -> dict[str, set[str]]:
    conn = sqlite3.connect(path)
    try:
        tables = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                  if not n.startswith("sqlite_")]
        return {t: {row[1] for row in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
    finally:
        conn.close()


def with_extra(monkeypatch: pytest.MonkeyPatch, *extra: _migrate.Migration) -> None:
    real = _migrate.load_migrations("postgresql")
    monkeypatch.setattr(_migrate, "load_migrations", lambda dialect, package="loopledger.engine": [*real, *extra])


def test_both_dialects_have_the_same_migrations() -> None:
    names = {d: [(m.version, m.name) for m in _migrate.load_migrations(d)] for d in ("sqlite", "postgresql")}
    assert names["postgresql"] == names["sqlite"]
    assert sorted(p.name for p in (MIGRATIONS / "postgresql").glob("*.sql")) == sorted(
        p.name for p in (MIGRATIONS / "sqlite").glob("*.sql"))


def test_a_new_database_gets_the_same_tables_and_columns_as_a_sqlite_journal(postgres_url: str, tmp_path: Path) -> None:
    store = PostgresRunStore(postgres_url)
    assert store.schema_version == len(_migrate.load_migrations("postgresql"))
    store.close()
    SQLiteRunStore(tmp_path / "journal.sqlite").close()
    pg = columns_pg(postgres_url)
    lite = columns_sqlite(tmp_path / "journal.sqlite")
    # PostgreSQL has no rowid: the two fact tables whose export order is
    # their insertion order have an identity column of that name.
    assert pg.pop("validations") - {"rowid"} == lite.pop("validations")
    assert pg.pop("loop_diagnoses") - {"rowid"} == lite.pop("loop_diagnoses")
    assert pg == lite

    expected = [
        (m.version, m.name, hashlib.sha256(m.sql.encode("utf-8")).hexdigest())
        for m in _migrate.load_migrations("postgresql")
    ]
    assert applied(postgres_url) == expected
    PostgresRunStore(postgres_url).close()  # opening again applies nothing
    assert applied(postgres_url) == expected


def test_an_older_database_is_upgraded_with_its_data(postgres_url: str) -> None:
    PostgresRunStore(postgres_url, migrate_to=3).close()
    raw = raw_connection("postgresql", postgres_url)
    try:
        # A run as version 3 stored it: the spec in the run row.
        raw.execute(
            "INSERT INTO runs (run_id, thread_id, task_id, tenant, prompt_version, model_route, state,"
            " state_version, last_seq, started_at, updated_at, spec_json, schema_version)"
            " VALUES ('old', 'old', 'task', 'acme', 'v1', 'scripted', 'READY', 1, 0, 1767323045000000,"
            " 1767323045000000, '{\"contract\":{\"goal\":\"g\"}}', 1)")
    finally:
        raw.close()
    store = PostgresRunStore(postgres_url)
    try:
        run = store.get_run("old")
        assert run.spec == {"contract": {"goal": "g"}}
        assert run.started_at == 1767323045000000  # microseconds fit: integers are BIGINT
        assert [v for v, _, _ in applied(postgres_url)] == list(range(1, store.schema_version + 1))
    finally:
        store.close()


@pytest.mark.slow
def test_processes_migrating_a_new_database_at_once_all_succeed(postgres_server: Any) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers = 4
    for _ in range(2):
        url = postgres_server.new_database()
        barrier = ctx.Barrier(workers, timeout=120)
        procs = [ctx.Process(target=migrate_worker, args=(url, barrier)) for _ in range(workers)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
        assert [proc.exitcode for proc in procs] == [0] * workers
        assert [v for v, _, _ in applied(url)] == [m.version for m in _migrate.load_migrations("postgresql")]


def test_a_failing_migration_changes_nothing(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PostgresRunStore(postgres_url)
    store.create_run(NewRun(run_id="r", task_id="t", tenant="acme"))
    latest = store.schema_version
    store.close()
    before = columns_pg(postgres_url)
    with_extra(monkeypatch, _migrate.Migration(
        latest + 1, "broken",
        "CREATE TABLE half_done (x BIGINT);\nUPDATE runs SET tenant = 'changed';\nINSERT INTO no_such_table VALUES (1);\n"))

    with pytest.raises(MigrationError) as caught:
        PostgresRunStore(postgres_url)
    assert (caught.value.version, caught.value.name) == (latest + 1, "broken")
    assert [v for v, _, _ in applied(postgres_url)] == list(range(1, latest + 1))
    assert columns_pg(postgres_url) == before  # DDL is transactional: no half_done
    monkeypatch.undo()
    store = PostgresRunStore(postgres_url)
    try:
        assert store.get_run("r").tenant == "acme"
    finally:
        store.close()


def test_a_database_migrated_by_a_newer_loopledger_is_refused(postgres_url: str) -> None:
    import psycopg

    from loopledger.engine._errors import JournalTooNew

    store = PostgresRunStore(postgres_url)
    latest = store.schema_version
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (%s, 'from_the_future', 'x', 0)", (latest + 1,))
    with pytest.raises(JournalTooNew, match=f"its schema is at version {latest + 1}, newer than") as caught:
        PostgresRunStore(postgres_url)
    assert caught.value.known == latest
    assert [v for v, _, _ in applied(postgres_url)] == list(range(1, latest + 2))


def test_an_edited_applied_migration_is_detected(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PostgresRunStore(postgres_url).close()
    edited = [
        _migrate.Migration(m.version, m.name, m.sql + "\n-- edited\n") if m.version == 2 else m
        for m in _migrate.load_migrations("postgresql")
    ]
    monkeypatch.setattr(_migrate, "load_migrations", lambda dialect, package="loopledger.engine": edited)
    with pytest.raises(MigrationError, match="changed") as caught:
        PostgresRunStore(postgres_url)
    assert caught.value.version == 2


@pytest.mark.parametrize(("url", "error"), [
    ("postgresql://someone:hunter2@127.0.0.1:1/journal", JournalError),
    ("postgresql://127.0.0.1:1/journal?user=someone&password=hunter2", JournalError),
    # Malformed, so bad input; the driver's message quotes the URL back.
    ("postgresql://someone:hunter2@[::1/journal", BadInput),
])
def test_a_failed_connection_is_one_line_without_the_password(url: str, error: type) -> None:
    with pytest.raises(error) as caught:
        open_journal(url)
    message = str(caught.value)
    assert "hunter2" not in message and "***" in message and "/journal" in message
    assert "\n" not in message


@pytest.mark.parametrize("url", ["postgresql://someone:Tr0ub@dor-horse-staple@127.0.0.1:1/journal",
                                 "postgres://someone:pa55@w0rd@x9z@localhost/journal"])
def test_an_unencoded_at_in_the_password_is_bad_input_quoting_none_of_it(url: str) -> None:
    """libpq would end the password at its first '@' and try to reach the rest as a host."""
    from loopledger.engine import BadInput

    with pytest.raises(BadInput, match="unencoded '@'.*%40") as caught:
        open_journal(url)
    secret = url.split("://")[1].split(":", 1)[1].rsplit("@", 1)[0]
    assert all(piece not in str(caught.value) for piece in secret.split("@")), caught.value
    assert "***@" in str(caught.value)


@pytest.mark.parametrize("url", ["postgresql://someone:pw@127.0.0.1:1/journal?application_name=me@laptop",
                                 "postgresql://someone:pw@127.0.0.1:1/journal?sslrootcert=/home/a@b/ca.pem"])
def test_an_at_in_the_query_is_no_password_of_the_url(url: str) -> None:
    """Only an '@' libpq reads into the host is refused: these URLs are fine (the server is not there)."""
    with pytest.raises(JournalError, match="cannot open the journal"):
        open_journal(url)


@pytest.mark.parametrize("url", ["postgresql://127.0.0.1:1", "postgresql://someone:pw@127.0.0.1:1/"])
def test_a_url_that_names_no_database_is_bad_input(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopledger.engine import BadInput

    monkeypatch.delenv("PGDATABASE", raising=False)
    with pytest.raises(BadInput, match="names no database") as caught:
        open_journal(url)
    assert "pw" not in str(caught.value)


def test_store_urls_are_told_apart(postgres_url: str, tmp_path: Path) -> None:
    pg = open_journal(postgres_url)
    lite = open_journal(f"sqlite:{tmp_path / 'j.sqlite'}")
    try:
        assert isinstance(pg, PostgresRunStore) and isinstance(lite, SQLiteRunStore)
        assert pg.journal_id() != lite.journal_id()
    finally:
        pg.close()
        lite.close()
    # A home with a PostgreSQL journal has no journal.sqlite of its own.
    home = Home(tmp_path / "home", postgres_url)
    home.open_store().close()
    assert not home.journal_path.exists()


def deadlocking_pair(url: str) -> tuple[PostgresRunStore, PostgresRunStore, list[str]]:
    """Two stores (two connections) whose next commits of two artifacts
    each store the first, wait for each other, then store the second: given
    the artifacts in opposite orders, each then waits for the key the other
    holds, and the server aborts one of them. Returns the stores and a list
    that records each transient abort they see."""
    barrier = threading.Barrier(2, timeout=30)
    aborts: list[str] = []
    stores = []
    for run_id in ("ra", "rb"):
        store = PostgresRunStore(url)
        store.create_run(NewRun(run_id=run_id, task_id="t", tenant="acme"))
        real_store, real_transient = store._store_artifacts, store._is_transient
        first = [True]

        def store_artifacts(conn: Any, run_id: str, seq: int, now: int, artifacts: Any,
                            real: Any = real_store, first: list[bool] = first) -> None:
            if first[0] and len(artifacts) == 2:
                first[0] = False
                real(conn, run_id, seq, now, artifacts[:1])
                barrier.wait()
                real(conn, run_id, seq, now, artifacts[1:])
                return
            real(conn, run_id, seq, now, artifacts)

        def is_transient(exc: BaseException, real: Any = real_transient, run_id: str = run_id) -> bool:
            transient = real(exc)
            if transient:
                aborts.append(run_id)
            return transient

        store._store_artifacts = store_artifacts  # type: ignore[method-assign]
        store._is_transient = is_transient  # type: ignore[method-assign]
        stores.append(store)
    return stores[0], stores[1], aborts


def commit_both(a: PostgresRunStore, b: PostgresRunStore) -> dict[str, Any]:
    x, y = Artifact("tool_result", {"x": 1}), Artifact("tool_result", {"y": 1})
    outcomes: dict[str, Any] = {}

    def commit(store: PostgresRunStore, run_id: str, artifacts: tuple[Artifact, ...]) -> None:
        try:
            outcomes[run_id] = store.commit(Commit(run_id=run_id, expected_version=1, to_state=State.MODEL_RUNNING,
                                                   artifacts=artifacts))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcomes[run_id] = exc

    threads = [threading.Thread(target=commit, args=(a, "ra", (x, y))),
               threading.Thread(target=commit, args=(b, "rb", (y, x)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


@pytest.mark.parametrize("group_commit", [False, True], ids=["commit", "group-commit"])
def test_commits_that_deadlock_on_shared_artifacts_are_both_made(postgres_url: str, group_commit: bool) -> None:
    a, b, aborts = deadlocking_pair(postgres_url)
    a.group_commit = b.group_commit = group_commit
    try:
        outcomes = commit_both(a, b)
        # The server aborted one of the two at least; a retry can meet the
        # other again before it commits and deadlock once more (seen under
        # load), so both may have been aborted by the time both are made.
        assert aborts, "the server should have aborted one of the two"
        for run_id, store in (("ra", a), ("rb", b)):
            assert not isinstance(outcomes[run_id], Exception), outcomes[run_id]
            run = store.get_run(run_id)
            assert (run.state, run.state_version) == (State.MODEL_RUNNING, 2)
            assert [e.seq for e in store.events(run_id)] == [1, 2]
        rows = raw_connection("postgresql", postgres_url)
        try:
            assert rows.execute("SELECT COUNT(*) FROM artifacts").fetchone() == (2,)
        finally:
            rows.close()
    finally:
        a.close()
        b.close()


def test_without_the_retry_the_deadlock_reaches_the_caller(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: its deadlock is real."""
    import psycopg

    monkeypatch.setattr(_store, "TRANSIENT_RETRIES", 0)
    a, b, _ = deadlocking_pair(postgres_url)
    try:
        outcomes = commit_both(a, b)
        failed = [o for o in outcomes.values() if isinstance(o, Exception)]
        assert len(failed) == 1 and isinstance(failed[0], psycopg.errors.DeadlockDetected), outcomes
    finally:
        a.close()
        b.close()


def exported_ids(traces: Path, table: str, column: str) -> list[Any]:
    import pyarrow.dataset as ds

    return sorted(ds.dataset(traces / table).to_table(columns=[column]).column(0).to_pylist())


def journal_ids(url: str, table: str, column: str) -> list[Any]:
    conn = raw_connection("postgresql", url)
    try:
        return sorted(row[0] for row in conn.execute(f"SELECT {column} FROM {table}").fetchall())
    finally:
        conn.close()


def assert_exported_whole(url: str, traces: Path) -> None:
    for table, column in (("artifacts", "artifact_id"), ("labels", "label_id"), ("events", "seq")):
        assert exported_ids(traces, table, column) == journal_ids(url, table, column), table


def two_runs(url: str) -> tuple[PostgresRunStore, PostgresRunStore]:
    early, late = PostgresRunStore(url), PostgresRunStore(url)
    early.create_run(NewRun(run_id="early", task_id="t", tenant="acme"))
    late.create_run(NewRun(run_id="late", task_id="t", tenant="acme"))
    return early, late


def label_of(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "step": 1, "attempt": 1, "candidate_id": "c", "expected_verdict": "accept",
            "source": "human"}


def test_an_export_beside_an_open_commit_misses_none_of_its_artifacts(postgres_url: str, tmp_path: Path) -> None:
    """Identity numbers are handed out at insert, not at commit: an open
    transaction can hold a lower artifact number than one that committed
    and was exported. Its artifact must still be exported, once."""
    from loopledger.engine import Recorder

    traces = tmp_path / "traces"
    early, late = two_runs(postgres_url)
    try:
        with early.batch():  # takes the lower artifact number and keeps it uncommitted
            early.commit(Commit(run_id="early", expected_version=1, to_state=State.MODEL_RUNNING,
                                artifacts=(Artifact("candidate", {"from": "early"}),)))
            late.commit(Commit(run_id="late", expected_version=1, to_state=State.MODEL_RUNNING,
                               artifacts=(Artifact("candidate", {"from": "late"}),)))
            assert Recorder(late, traces).export().rows["artifacts"] == 1
        Recorder(late, traces).export()
        assert_exported_whole(postgres_url, traces)
        assert len(journal_ids(postgres_url, "artifacts", "artifact_id")) == 2
    finally:
        early.close()
        late.close()


def test_an_export_waits_for_a_label_being_written_and_misses_none(postgres_url: str, tmp_path: Path) -> None:
    """The same for labels, which belong to no run's commit: an export's
    snapshot is taken only while no label is being written."""
    from loopledger.engine import Recorder

    traces = tmp_path / "traces"
    early, late = two_runs(postgres_url)
    watcher = raw_connection("postgresql", postgres_url)
    try:
        with early.batch():  # takes the lower label id and keeps it uncommitted
            early.add_label(label_of("early"))
            late.add_label(label_of("late"))
            exporter = threading.Thread(target=lambda: Recorder(late, traces).export())
            exporter.start()
            # Leave the batch open until the export either finished or waits for it.
            while exporter.is_alive() and not watcher.execute(
                    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchall():
                exporter.join(timeout=0.01)
        exporter.join(timeout=60)
        assert not exporter.is_alive()
        Recorder(late, traces).export()
        assert_exported_whole(postgres_url, traces)
        assert len(journal_ids(postgres_url, "labels", "label_id")) == 2
    finally:
        watcher.close()
        early.close()
        late.close()


def test_exports_list_runs_in_code_point_order_whatever_the_database_collation(postgres_server: Any,
                                                                                tmp_path: Path) -> None:
    """Under an ICU en-US collation PostgreSQL sorts ``a_b`` before ``B``;
    SQLite sorts by code point. The export orders by code point on both."""
    from loopledger.engine import Recorder

    url = postgres_server.new_database("TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    store = PostgresRunStore(url)
    ids = ["B.v1", "a.v1", "a_b.v1", "a.b.v1"]
    try:
        for run_id in ids:
            store.create_run(NewRun(run_id=run_id, task_id="t", tenant="acme"))
        Recorder(store, tmp_path / "traces").export()
    finally:
        store.close()
    import pyarrow.parquet as pq

    (segment,) = (tmp_path / "traces" / "events").glob("seg-*.parquet")
    assert pq.read_table(segment).column("run_id").to_pylist() == sorted(ids)


def test_a_claim_whose_session_ends_sends_nothing_more(tmp_path: Path, postgres_url: str) -> None:
    """The claims live on a server session: when it ends while the process
    drives the run (a server restart, a connection cut), another process may
    take the run. This one sends no side effect after that (ClaimLost), and
    the run is finished by a resume with each side effect executed once."""
    import psycopg

    from loopledger.engine._errors import ClaimLost
    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner
    from loopledger.engine._scenario import load_scenario

    home = Home.resolve(tmp_path / "home", postgres_url)
    scenarios = Path(loopledger.engine.__file__).resolve().parents[1] / "datasets" / "scenarios"
    first = Runner(home)
    sent: list[str] = []
    try:
        run_id = first.create(load_scenario(scenarios / "happy-refund.yaml"), "v1")
        execute = first.backend.execute

        def cut_after_the_lookup(request: Any) -> Any:
            sent.append(request.tool)
            if request.tool == "orders.get_order":
                with psycopg.connect(postgres_url, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (first.store._drivers.info.backend_pid,))
            return execute(request)

        first.backend.execute = cut_after_the_lookup
        with pytest.raises(ClaimLost, match=f"run {run_id}: this process lost its claim"):
            first.controller.drive(run_id)
    finally:
        first.close()
    assert sent == ["orders.get_order"]  # the refund was dispatched in the journal, never sent
    second = Runner(home)
    try:
        assert second.controller.drive(run_id).state.value == "SUCCEEDED"
        assert second.backend.side_effects(run_id) == {"payments.refund": 1}
    finally:
        second.close()


def test_a_journal_connection_cut_mid_run_names_the_journal(tmp_path: Path, postgres_url: str) -> None:
    """The server ending the journal's session is the journal's failure (every
    run meets it), told as such with the store, not as one run's bug; the run
    stays at its last commit, and a resume finishes it, each effect once."""
    import psycopg

    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner
    from loopledger.engine._scenario import load_scenario

    home = Home.resolve(tmp_path / "home", postgres_url)
    scenarios = Path(loopledger.engine.__file__).resolve().parents[1] / "datasets" / "scenarios"
    first = Runner(home, export=False)
    try:
        run_id = first.create(load_scenario(scenarios / "happy-refund.yaml"), "v1")
        execute = first.backend.execute

        def cut(request: Any) -> Any:
            outcome = execute(request)
            if request.tool == "orders.get_order":
                with psycopg.connect(postgres_url, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (first.store._conn.info.backend_pid,))
            return outcome

        first.backend.execute = cut
        with pytest.raises(JournalError, match=r"^PostgreSQL journal at postgresql://.*: .*terminat"):
            first.drive_all([run_id])
    finally:
        try:
            first.close()
        except Exception:  # noqa: BLE001 - its connection is gone
            pass
    second = Runner(home, export=False)
    try:
        second.drive_all([run_id])
        assert second.store.get_run(run_id).state.value == "SUCCEEDED"
        assert second.backend.side_effects(run_id) == {"payments.refund": 1}
    finally:
        second.close()


def test_a_send_from_a_driver_that_lost_the_run_is_fenced_off(tmp_path: Path, postgres_url: str) -> None:
    """The claims' session ends while a refund is on its way to the provider
    (a slow network); another process takes the run over, finds the refund
    not executed and sends it. When the first send arrives at last, the
    backend refuses it: it carries the lost claim's number, lower than the
    new driver's. One execution, and the run ends once."""
    import psycopg

    from loopledger.engine._errors import ClaimLost
    from loopledger.engine._home import Home
    from loopledger.engine._runner import Runner
    from loopledger.engine._scenario import load_scenario

    home = Home.resolve(tmp_path / "home", postgres_url)
    scenarios = Path(loopledger.engine.__file__).resolve().parents[1] / "datasets" / "scenarios"
    first, second = Runner(home, export=False), Runner(home, export=False)
    taken_over: list[str] = []
    try:
        run_id = first.create(load_scenario(scenarios / "happy-refund.yaml"), "v1")
        execute = first.backend.execute

        def slow_network(request: Any) -> Any:
            if request.tool == "payments.refund" and not taken_over:
                with psycopg.connect(postgres_url, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (first.store._drivers.info.backend_pid,))
                # Meanwhile, elsewhere. The terminated session lets go of its
                # locks when its server process has ended, a moment later:
                # the other driver waits for that, as `resume` would retry.
                taken_over.append(second.controller.drive(run_id, wait_s=30).state.value)
            return execute(request)

        first.backend.execute = slow_network
        with pytest.raises(ClaimLost):
            first.controller.drive(run_id)
        assert taken_over == ["SUCCEEDED"]
        assert second.backend.side_effects(run_id) == {"payments.refund": 1}
        assert second.store.get_run(run_id).state.value == "SUCCEEDED"
    finally:
        second.close()
        try:
            first.close()
        except Exception:  # noqa: BLE001 - its claims' session is gone
            pass
