"""The commands with ``--store postgresql://...``: the journal moves to
PostgreSQL, everything else (traces, replays, the demo backends) stays in
``--home`` and behaves the same (CONTRACT.md, "The data directory")."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from invariants import all_violations
from journal_kit import raw_connection

SCENARIOS = Path(__file__).parents[2] / "datasets" / "scenarios"
CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]


def cli(*args: str, home: Path, store: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    merged.update(env or {})
    return subprocess.run([*CLI, *args, "--home", str(home), "--store", store], capture_output=True, text=True,
                          timeout=300, env=merged)


def lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]


def journal_rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = raw_connection("postgresql", url)
    try:
        return [tuple(r) for r in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()


@pytest.mark.slow
def test_the_bundled_scenarios_meet_their_expectations_on_a_postgresql_journal(
    tmp_path: Path, postgres_url: str
) -> None:
    home = tmp_path / "home"
    ran = cli("run", str(SCENARIOS), "--check", "--json", home=home, store=postgres_url)
    assert ran.returncode == 0, ran.stderr
    runs = lines(ran)
    assert len(runs) == len(list(SCENARIOS.glob("*.yaml")))
    assert not (home / "journal.sqlite").exists(), "the journal is the database, not a file in --home"
    assert all_violations(home, postgres_url) == []

    # The traces are the journal's, as with SQLite: every run, every event.
    exported = ds.dataset(home / "traces" / "runs").to_table(columns=["run_id", "status"]).to_pylist()
    assert {(r["run_id"], r["status"]) for r in exported} == {(r["run_id"], r["status"]) for r in runs}
    (events,) = journal_rows(postgres_url, "SELECT COUNT(*) FROM events")
    assert ds.dataset(home / "traces" / "events").count_rows() == events[0]
    again = cli("export", home=home, store=postgres_url)
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr

    # Replaying the recorded decisions with the suite that made them: no flip.
    replayed = subprocess.run([*CLI, "replay", "--suite", "default", "--fail-on", "flips", "--home", str(home)],
                              capture_output=True, text=True, timeout=300)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr

    some = next(r for r in runs if r["status"] == "SUCCEEDED")
    shown = cli("show", some["run_id"], home=home, store=postgres_url)
    assert shown.returncode == 0, shown.stderr
    assert "FINALIZING" in shown.stdout and "SUCCEEDED" in shown.stdout


def test_an_approval_is_delivered_through_the_postgresql_journal(tmp_path: Path, postgres_url: str) -> None:
    home = tmp_path / "home"
    ran = cli("run", str(SCENARIOS / "approval-waits-for-person.yaml"), "--json", home=home, store=postgres_url)
    assert ran.returncode == 0, ran.stderr
    (line,) = lines(ran)
    assert (line["status"], line["waiting"]["kind"]) == ("WAITING_USER", "approval")
    token = line["waiting"]["resume_token"]
    ok = cli("reply", line["run_id"], "--token", token, "--approve", "--json", home=home, store=postgres_url)
    assert ok.returncode == 0, ok.stderr
    (done,) = lines(ok)
    assert (done["status"], done["reason"]) == ("SUCCEEDED", "completed")
    again = cli("reply", line["run_id"], "--token", token, "--approve", "--json", home=home, store=postgres_url)
    assert again.returncode == 1 and "already used" in again.stderr
    assert all_violations(home, postgres_url) == []


def test_a_run_killed_after_its_dispatch_is_resumed_from_the_postgresql_journal(
    tmp_path: Path, postgres_url: str
) -> None:
    home = tmp_path / "home"
    died = cli("run", str(SCENARIOS / "happy-refund.yaml"), "--json", home=home, store=postgres_url,
               env={"LOOPLEDGER_CRASH_AT": "after_dispatch"})
    assert died.returncode == -signal.SIGKILL, died.stderr
    ((run_id, state),) = journal_rows(postgres_url, "SELECT run_id, state FROM runs")
    assert state == "TOOL_RUNNING"

    resumed = cli("resume", "--json", home=home, store=postgres_url)
    assert resumed.returncode == 0, resumed.stderr
    (line,) = lines(resumed)
    assert (line["run_id"], line["status"]) == (run_id, "SUCCEEDED")
    backend = sqlite3.connect(home / "demo_backend.sqlite")
    try:
        (count,) = backend.execute(
            "SELECT COUNT(*) FROM executions WHERE run_id = ? AND tool = 'payments.refund'", (run_id,)).fetchone()
    finally:
        backend.close()
    assert count == 1, "the refund ran once: resume reconciled it instead of sending it again"
    assert all_violations(home, postgres_url) == []


def test_a_label_is_written_to_the_postgresql_journal_and_exported(tmp_path: Path, postgres_url: str) -> None:
    home = tmp_path / "home"
    ran = cli("run", str(SCENARIOS / "happy-read-file.yaml"), "--json", home=home, store=postgres_url)
    assert ran.returncode == 0, ran.stderr
    (line,) = lines(ran)
    labelled = cli("label", line["run_id"], "--step", "1", "--attempt", "1", "--expect", "reject",
                   "--note", "should not read it", home=home, store=postgres_url)
    assert labelled.returncode == 0, labelled.stderr
    rows = journal_rows(postgres_url, "SELECT run_id, expected_verdict, source FROM labels WHERE source = 'human'")
    assert rows == [(line["run_id"], "reject", "human")]
    exported = ds.dataset(home / "traces" / "labels").to_table().to_pylist()
    assert [(r["run_id"], r["expected_verdict"]) for r in exported if r["source"] == "human"] == [
        (line["run_id"], "reject")]


def test_the_workbench_writes_its_labels_to_the_postgresql_journal(tmp_path: Path, postgres_url: str) -> None:
    from loopledger.ui._labels import add_human_label

    home = tmp_path / "home"
    ran = cli("run", str(SCENARIOS / "happy-read-file.yaml"), "--json", home=home, store=postgres_url)
    assert ran.returncode == 0, ran.stderr
    (line,) = lines(ran)
    label_id = add_human_label(home, run_id=line["run_id"], step=1, attempt=1, candidate_id="c",
                               validator="", expected_verdict="accept", store_url=postgres_url)
    assert journal_rows(postgres_url, "SELECT label_id, source FROM labels WHERE label_id = ?", (label_id,)) == [
        (label_id, "human")]
    assert not (home / "journal.sqlite").exists()


def test_a_server_that_is_not_there_is_an_infrastructure_failure(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = cli("run", str(SCENARIOS / "happy-refund.yaml"), home=home,
               store="postgresql://loopledger:secret@127.0.0.1:1/journal")
    assert proc.returncode == 3, proc.stderr
    lines_ = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines_) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "127.0.0.1:1/journal" in lines_[0] and "secret" not in lines_[0]


@pytest.mark.slow
def test_the_demo_on_a_postgresql_journal_prints_commands_that_reach_it(tmp_path: Path, postgres_url: str) -> None:
    home = tmp_path / "home"
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    demo = subprocess.run([*CLI, "demo", "--home", str(home), "--store", postgres_url], capture_output=True,
                          text=True, timeout=600, env={**merged, "COLUMNS": "400"})
    assert demo.returncode == 0, demo.stderr
    assert "PostgreSQL journal" in demo.stdout and "114 of 114 runs" in demo.stdout
    (inspect,) = [line for line in demo.stdout.splitlines() if line.startswith("Inspect one run:")]
    command = shlex.split(inspect.split(":", 1)[1])
    assert command[:2] == ["loopledger", "show"] and command[-2:] == ["--store", postgres_url]
    shown = subprocess.run([*CLI, *command[1:]], capture_output=True, text=True, timeout=120, env=merged)
    assert shown.returncode == 0, shown.stderr
    assert not (home / "journal.sqlite").exists()


def test_a_database_whose_tables_are_not_a_journal_is_one_line(tmp_path: Path, postgres_url: str) -> None:
    conn = raw_connection("postgresql", postgres_url)
    try:
        conn.execute("CREATE TABLE schema_migrations (version TEXT)")
    finally:
        conn.close()
    proc = cli("show", "some-run", home=tmp_path / "home", store=postgres_url)
    assert proc.returncode == 3, proc.stderr
    lines_ = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines_) == 1 and "migration 0001_journal failed" in lines_[0], proc.stderr


EXPORT_SLOWLY = """\
id: pg-export-slowly
contract:
  goal: Export the monthly report
  required_evidence: [report_ready]
  allowed_tools: [reports.export]
model:
  - tool_calls: [{name: reports.export, arguments: {query: monthly, delay_s: 20}}]
  - final: Exported.
    claims: [{text: exported, evidence: [report_ready]}]
"""


def waiting_for_tool(url: str) -> bool:
    try:
        return bool(journal_rows(url, "SELECT 1 FROM runs WHERE state = 'WAITING_TOOL'"))
    except Exception:  # noqa: BLE001 - the journal's tables are not made yet
        return False


def test_a_connection_lost_mid_command_is_one_line_naming_the_journal(tmp_path: Path, postgres_url: str) -> None:
    """The server ends the command's connections while it waits for a
    background export: exit 3 and one line naming the journal's URL, as a
    failure to open it would (docs/journal.md), not the driver's bare words."""
    import time

    scenario = tmp_path / "export.yaml"
    scenario.write_text(EXPORT_SLOWLY)
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    proc = subprocess.Popen([*CLI, "run", str(scenario), "--home", str(tmp_path / "home"), "--store", postgres_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=merged)
    try:
        deadline = time.monotonic() + 60
        while not waiting_for_tool(postgres_url):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        journal_rows(postgres_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                   " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, stderr
    lines_ = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines_) == 1 and "Traceback" not in stderr, stderr
    database = postgres_url.rsplit("/", 1)[1].split("?")[0]
    # The driving thread or the export thread meets it first: either names the journal.
    assert lines_[0].startswith("loopledger: journal: ") and "postgresql://" in lines_[0], lines_[0]
    assert database in lines_[0], lines_[0]


def test_a_role_that_may_only_read_the_journal_can_show_a_run(tmp_path: Path, postgres_url: str) -> None:
    """Opening a migrated journal writes nothing (no version table made, no
    lock taken), so `show` works for a role with SELECT only."""
    import psycopg

    home = tmp_path / "home"
    ran = cli("run", str(SCENARIOS / "happy-refund.yaml"), "--json", home=home, store=postgres_url)
    assert ran.returncode == 0, ran.stderr
    (run,) = lines(ran)
    parts = psycopg.conninfo.conninfo_to_dict(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS journal_reader")
        admin.execute("CREATE ROLE journal_reader LOGIN")
        admin.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO journal_reader")
    reader = f"postgresql://journal_reader@{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}/{parts['dbname']}"
    shown = cli("show", run["run_id"], "--json", home=home, store=reader)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "SUCCEEDED"
