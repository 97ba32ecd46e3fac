"""``loopledger replay`` and ``loopledger label`` as a CI job meets them:
exit codes, reports, and one clear line for bad input."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loopledger.replay import TracesError, replay
from replay_kit import REPO, cli

REPO_SCENARIOS = REPO / "datasets" / "scenarios"


def one_line(stderr: str, *names: str) -> None:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_the_recording_suite_passes_every_gate(recorded_home: Path, tmp_path: Path) -> None:
    out = cli("replay", "--suite", "default", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--fail-on", "flips", "--markdown", str(tmp_path / "r.md"), "--junit", str(tmp_path / "r.xml"))
    assert out.returncode == 0, out.stderr
    assert "Gate: pass" in out.stdout
    assert "**Gate (`--fail-on flips`): pass**" in (tmp_path / "r.md").read_text()
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "0" and int(suite.get("tests")) > 40
    assert len(list(tmp_path.joinpath("replays").iterdir())) == 1


def test_a_report_only_gate_says_so(recorded_home: Path, tmp_path: Path) -> None:
    out = cli("replay", "--suite", "strict", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--fail-on", "never", "--markdown", str(tmp_path / "r.md"))
    assert out.returncode == 0, out.stderr
    assert "Gate: pass (report only)" in out.stdout
    assert "**Gate (`--fail-on never`): pass (report only)**" in (tmp_path / "r.md").read_text()


def test_flips_fail_only_the_gates_that_ask_for_them(recorded_home: Path, tmp_path: Path) -> None:
    common = ["replay", "--suite", "strict", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path)]
    assert cli(*common).returncode == 0  # no label speaks against strict: no regression
    assert cli(*common, "--fail-on", "never").returncode == 0
    flips = cli(*common, "--fail-on", "flips", "--junit", str(tmp_path / "r.xml"), "--markdown", str(tmp_path / "r.md"))
    assert flips.returncode == 1, flips.stderr
    assert "Gate: fail" in flips.stdout
    failed = [c for c in ET.parse(tmp_path / "r.xml").getroot() if c.find("failure") is not None]
    assert failed and all("diverges at step" in c.find("failure").get("message") for c in failed)
    assert "## Runs diverged" in (tmp_path / "r.md").read_text()


def test_a_regression_fails_the_default_gate(recorded_home: Path, tmp_path: Path, suite_file) -> None:
    suite = suite_file(**{"loop.repeated_call": {"threshold": 4}})
    out = cli("replay", "--suite", str(suite), "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--markdown", str(tmp_path / "r.md"))
    assert out.returncode == 1, out.stderr
    assert "## Regressions" in (tmp_path / "r.md").read_text()


def test_a_replay_id_baseline_from_the_command_line(recorded_home: Path, tmp_path: Path) -> None:
    common = ["--traces", str(recorded_home / "traces"), "--home", str(tmp_path)]
    assert cli("replay", "--suite", "strict", *common).returncode == 0
    (first,) = [p.name for p in (tmp_path / "replays").iterdir()]
    out = cli("replay", "--suite", "strict", "--baseline", first, "--fail-on", "flips", *common)
    assert out.returncode == 0, out.stdout + out.stderr


# --- bad input: exit 2, one line ------------------------------------------------


def replay_on(home: Path, *extra: str) -> object:
    return cli("replay", "--suite", "default", "--home", str(home), *extra)


@pytest.mark.parametrize("table", ["candidates", "labels"])
def test_missing_table(home_copy: Path, table: str) -> None:
    """``labels`` too: run, export and import always write it (an empty file
    when there are none), so a missing one is a lost table, and reading it
    as "no labels" would let regressions pass as changes."""
    shutil.rmtree(home_copy / "traces" / table)
    out = replay_on(home_copy)
    assert out.returncode == 2
    one_line(out.stderr, str(home_copy / "traces" / table), f"missing table {table!r}")


def test_no_traces_at_all(tmp_path: Path) -> None:
    out = replay_on(tmp_path)
    assert out.returncode == 2
    one_line(out.stderr, "no such trace directory")
    given = tmp_path / "suite.yaml"
    given.write_text("name: x\nvalidators: [structure]\n")
    out = cli("replay", "--suite", "default", "--traces", str(given), "--home", str(tmp_path))
    assert out.returncode == 2
    one_line(out.stderr, f"{given}: not a directory (expected <home>/traces")


def test_traces_with_no_run_are_bad_input_not_a_pass(tmp_path: Path) -> None:
    """An export of an empty journal writes every table, with no row: a gate
    over them would pass on nothing."""
    home = tmp_path / "home"
    home.mkdir()
    sqlite3.connect(home / "journal.sqlite").close()  # an empty journal: the store makes its schema
    assert cli("export", "--home", str(home)).returncode == 0
    assert (home / "traces" / "runs").is_dir()
    out = replay_on(home, "--fail-on", "flips")
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, "runs", "no run recorded")
    assert not (home / "replays").exists() or not any((home / "replays").iterdir())


def test_label_and_show_name_a_trace_file_they_cannot_read(home_copy: Path) -> None:
    import duckdb

    run_id = duckdb.connect().execute(
        f"SELECT min(run_id) FROM read_parquet('{home_copy}/traces/runs/*.parquet')").fetchone()[0]
    table = next((home_copy / "traces" / "runs").glob("*.parquet"))
    table.write_bytes(table.read_bytes()[:100])
    prefix = run_id.rsplit(".", 1)[0]
    for args in (["label", prefix, "--step", "1", "--expect", "accept"], ["show", prefix]):
        out = cli(*args, "--home", str(home_copy))
        assert out.returncode == 2, (args, out.stdout)
        one_line(out.stderr, table.name, "not a readable trace table")
    # A run named whole is found in the journal first: the broken file is not in its way.
    assert cli("show", run_id, "--home", str(home_copy)).returncode == 0


def test_wrong_schema_version(home_copy: Path) -> None:
    (path,) = list((home_copy / "traces" / "runs").glob("*.parquet"))
    table = pq.read_table(path)
    index = table.schema.get_field_index("schema_version")
    table = table.set_column(index, "schema_version", pa.array([99] * table.num_rows, pa.int64()))
    pq.write_table(table, path)
    out = replay_on(home_copy)
    assert out.returncode == 2
    one_line(out.stderr, path.name, "schema_version 99", "reads up to 1")


@pytest.mark.parametrize("values, said", [
    ([0], "schema_version 0; expected 1 to 1"),
    ([-1], "schema_version -1; expected 1 to 1"),
    ([None], "schema_version missing in"),
    (["1"], "holds no whole numbers"),
])
def test_a_schema_version_no_build_wrote(home_copy: Path, values: list, said: str) -> None:
    (path,) = list((home_copy / "traces" / "runs").glob("*.parquet"))
    table = pq.read_table(path)
    index = table.schema.get_field_index("schema_version")
    column = pa.array(values * table.num_rows, pa.string() if isinstance(values[0], str) else pa.int64())
    pq.write_table(table.set_column(index, "schema_version", column), path)
    out = replay_on(home_copy)
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, path.name, said)


@pytest.mark.parametrize("table", ["runs", "events", "artifacts", "candidates", "validations", "labels"])
def test_a_trace_file_without_its_schema_version_column_is_refused(home_copy: Path, table: str) -> None:
    path = sorted((home_copy / "traces" / table).glob("*.parquet"))[0]
    pq.write_table(pq.read_table(path).drop_columns(["schema_version"]), path)
    out = replay_on(home_copy)
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, path.name, "no column 'schema_version'")


def test_corrupt_parquet(home_copy: Path) -> None:
    victim = sorted((home_copy / "traces" / "events").glob("*.parquet"))[0]
    victim.write_bytes(b"PAR1 this is not a parquet file at all")
    out = replay_on(home_copy)
    assert out.returncode == 2
    one_line(out.stderr, victim.name, "not a readable Parquet file")


def test_corrupt_data_pages_name_the_file(home_copy: Path) -> None:
    """The footer reads, the pages do not: the file is still named."""
    victim = sorted((home_copy / "traces" / "candidates").glob("*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    data[4:40] = bytes(b ^ 0xFF for b in data[4:40])  # the first page header
    victim.write_bytes(bytes(data))
    out = replay_on(home_copy)
    assert out.returncode == 2
    one_line(out.stderr, f"candidates/{victim.name}", "not a readable Parquet file")


@pytest.mark.parametrize(("table", "column"), [("runs", "status"), ("labels", "note")])
def test_missing_column(home_copy: Path, table: str, column: str) -> None:
    for path in (home_copy / "traces" / table).glob("*.parquet"):
        pq.write_table(pq.read_table(path).drop_columns([column]), path)
    out = replay_on(home_copy)
    assert out.returncode == 2
    one_line(out.stderr, f"lacks column(s) {column}")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--suite", "no-such-suite"], ["unknown suite 'no-such-suite'"]),
        (["--suite", "missing.yaml"], ["missing.yaml", "cannot read"]),
        (["--suite", "default", "--baseline", "r-nope"], ["--baseline", "r-nope"]),
        (["--suite", "default", "--fail-on", "sometimes"], ["--fail-on", "sometimes"]),
        (["--suite", "default", "--junit", "/no/such/folder/r.xml"], ["--junit", "/no/such/folder"]),
    ],
)
def test_bad_options(recorded_home: Path, tmp_path: Path, args: list[str], names: list[str]) -> None:
    out = cli("replay", *args, "--traces", str(recorded_home / "traces"), "--home", str(tmp_path))
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, *names)


def test_a_report_path_that_is_a_folder_is_refused_before_the_work(recorded_home: Path, tmp_path: Path) -> None:
    out = cli("replay", "--suite", "default", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--markdown", str(tmp_path))
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, "--markdown", "it is a folder")
    assert not (tmp_path / "replays").exists()


def test_a_report_path_that_would_overwrite_what_is_recorded_is_refused(home_copy: Path, tmp_path: Path) -> None:
    """The journal, a trace table, the replays folder, the traces read, or
    the suite file: each stays as it was, exit 2 (a report beside them in
    the data directory is fine)."""
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: mine\nvalidators: [structure]\n")
    upper = tmp_path / "SUITE.YAML"  # a suffix the loader reads whatever its case
    upper.write_text("name: mine\nvalidators: [structure]\n")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(home_copy / "traces", elsewhere)
    table = next((home_copy / "traces" / "runs").rglob("*.parquet"))
    workspace_file = next(p for p in (home_copy / "workspaces").rglob("*") if p.is_file())
    cases = [
        (["--home", str(home_copy), "--markdown", str(home_copy / "journal.sqlite")], home_copy / "journal.sqlite"),
        (["--home", str(home_copy), "--junit", str(table)], table),
        (["--home", str(home_copy), "--junit", str(home_copy / "traces" / "runs" / "report.xml")], None),
        (["--home", str(home_copy), "--traces", str(elsewhere), "--markdown", str(elsewhere / "events" / "r.md")],
         None),
        (["--home", str(home_copy), "--suite", str(suite), "--markdown", str(suite)], suite),
        (["--home", str(home_copy), "--suite", str(upper), "--junit", str(upper)], upper),
        # What a traces folder holds beside its tables: the marker naming their journal, the export lock.
        (["--home", str(home_copy), "--markdown", str(home_copy / "traces" / ".journal")],
         home_copy / "traces" / ".journal"),
        (["--home", str(home_copy), "--traces", str(elsewhere), "--junit", str(elsewhere / ".journal")],
         elsewhere / ".journal"),
        (["--home", str(home_copy), "--junit", str(home_copy / "traces" / ".export.lock")], None),
        # The demo backends' state: a run's workspace files.
        (["--home", str(home_copy), "--markdown", str(workspace_file)], workspace_file),
        # The journal's lock file of its drivers.
        (["--home", str(home_copy), "--junit", str(home_copy / "journal.sqlite-drivers")], None),
    ]
    for args, kept in cases:
        before = kept.read_bytes() if kept else None
        out = cli("replay", *(["--suite", "default"] if "--suite" not in args else []), *args)
        assert out.returncode == 2, (args, out.stdout)
        one_line(out.stderr, "--markdown" if "--markdown" in args else "--junit", "overwrite what is recorded")
        if kept:
            assert kept.read_bytes() == before
    assert not (elsewhere / "events" / "r.md").exists() and not (home_copy / "traces" / "runs" / "report.xml").exists()
    assert not (home_copy / "replays").exists()
    # Beside the journal, or beside the tables in a traces folder (a CI job run from there), overwrites nothing.
    for report in (home_copy / "report.md", elsewhere / "report.md"):
        beside = cli("replay", "--suite", "default", "--home", str(home_copy), "--traces", str(elsewhere),
                     "--markdown", str(report))
        assert beside.returncode == 0, beside.stderr
        assert report.read_text().strip()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_report_that_cannot_be_written_is_named(recorded_home: Path, tmp_path: Path) -> None:
    out = cli("replay", "--suite", "default", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--markdown", "/dev/full")
    assert out.returncode == 3, out.stdout
    one_line(out.stderr, "/dev/full", "cannot write the report", "No space left")


def test_junit_stays_xml_whatever_the_task_ids_hold(home_copy: Path, tmp_path: Path) -> None:
    (path,) = list((home_copy / "traces" / "runs").glob("*.parquet"))
    table = pq.read_table(path)
    odd = pa.array([f"ctl\x01{t}\x1b[31m<&>" for t in table.column("task_id").to_pylist()])
    pq.write_table(table.set_column(table.schema.get_field_index("task_id"), "task_id", odd), path)
    out = cli("replay", "--suite", "default", "--home", str(home_copy), "--junit", str(tmp_path / "r.xml"))
    assert out.returncode == 0, out.stderr
    classes = {case.get("classname") for case in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert "ctl\\x01happy-refund\\x1b[31m<&>" in classes


def test_a_missing_artifact_is_named_and_the_other_runs_replay(home_copy: Path, tmp_path: Path) -> None:
    import duckdb

    traces = home_copy / "traces"
    con = duckdb.connect()
    victim = con.execute(f"SELECT run_id, candidate_id FROM read_parquet('{traces}/candidates/*.parquet') "
                         "ORDER BY run_id LIMIT 1").fetchone()
    files = sorted((traces / "artifacts").glob("*.parquet"))
    for path in files:
        table = pq.read_table(path)
        keep = [i for i, a in enumerate(table.column("artifact_id").to_pylist()) if a != victim[1]]
        pq.write_table(table.take(keep), path)
    out = cli("replay", "--suite", "default", "--home", str(home_copy), "--junit", str(tmp_path / "r.xml"))
    assert out.returncode == 2
    one_line(out.stderr, victim[0], victim[1], "not in the traces")
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert suite.get("errors") == "1"


def test_an_artifact_changed_after_recording_is_named(home_copy: Path) -> None:
    """A body that no longer hashes to its id would have the suite judge
    something the run never saw: that run is refused, by name."""
    import duckdb

    traces = home_copy / "traces"
    run_id, candidate_id = duckdb.connect().execute(
        f"SELECT run_id, candidate_id FROM read_parquet('{traces}/candidates/*.parquet') ORDER BY run_id LIMIT 1"
    ).fetchone()
    for path in sorted((traces / "artifacts").glob("*.parquet")):
        table = pq.read_table(path)
        bodies = [b + " " if a == candidate_id else b
                  for a, b in zip(table.column("artifact_id").to_pylist(), table.column("body").to_pylist())]
        pq.write_table(table.set_column(table.schema.get_field_index("body"), "body", pa.array(bodies)), path)
    out = replay_on(home_copy)
    assert out.returncode == 2
    one_line(out.stderr, run_id, candidate_id, "does not hash to its id")


# --- label ---------------------------------------------------------------------------


def test_label_rejects_bad_input(home_copy: Path) -> None:
    out = cli("label", "no-such-run", "--step", "1", "--expect", "accept", "--home", str(home_copy))
    assert out.returncode == 2
    one_line(out.stderr, "unknown run 'no-such-run'")
    out = cli("label", "x", "--step", "1", "--expect", "maybe", "--home", str(home_copy))
    assert out.returncode == 2
    one_line(out.stderr, "--expect", "maybe")


def _run_of(home: Path, task_id: str) -> str:
    import duckdb

    return duckdb.sql(f"SELECT run_id FROM '{home}/traces/runs/*.parquet' WHERE task_id = '{task_id}'").fetchone()[0]


def test_label_on_a_candidate_that_never_reached_validation_is_refused(home_copy: Path) -> None:
    run_id = _run_of(home_copy, "model-truncated-then-ok")  # step 1: attempt 1 cut off, attempt 2 validated
    out = cli("label", run_id, "--step", "1", "--expect", "reject", "--home", str(home_copy))
    assert out.returncode == 2
    one_line(out.stderr, "--step/--attempt", "never validated its candidate at step 1 attempt 1",
             "finish_reason incomplete", "validated step/attempt: 1/2")
    out = cli("label", run_id, "--step", "1", "--attempt", "2", "--expect", "reject", "--home", str(home_copy))
    assert out.returncode == 0, out.stderr


def test_label_takes_a_unique_start_of_a_run_id(home_copy: Path) -> None:
    run_id = _run_of(home_copy, "happy-refund")
    out = cli("label", run_id[:-4], "--step", "1", "--expect", "accept", "--home", str(home_copy))
    assert out.returncode == 0, out.stderr
    assert run_id in out.stdout
    assert pq.read_table(home_copy / "traces" / "labels", filters=[("source", "=", "human")]).column(
        "run_id").to_pylist() == [run_id]
    out = cli("label", "happy-", "--step", "1", "--expect", "accept", "--home", str(home_copy))
    assert out.returncode == 2
    one_line(out.stderr, "RUN_ID", "'happy-' is ambiguous", "runs start with it")


def test_label_in_a_home_holding_another_journals_traces_writes_nothing(recorded_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "copy"
    shutil.copytree(recorded_home / "traces", home / "traces")
    run_id = _run_of(home, "happy-refund")
    for _ in range(2):
        out = cli("label", run_id, "--step", "1", "--expect", "accept", "--home", str(home))
        assert out.returncode == 2
        one_line(out.stderr, "--home", "holds traces another journal exported")
    assert not (home / "journal.sqlite").exists()
    # With a journal of its own (another one), the same: refused before the label is written.
    (tmp_path / "other").mkdir()
    sqlite3.connect(tmp_path / "other" / "journal.sqlite").close()
    assert cli("export", "--home", str(tmp_path / "other")).returncode == 0
    shutil.copy(tmp_path / "other" / "journal.sqlite", home / "journal.sqlite")
    out = cli("label", run_id, "--step", "1", "--expect", "accept", "--home", str(home))
    assert out.returncode == 2
    one_line(out.stderr, "--home", "holds traces another journal exported")
    assert sqlite3.connect(home / "journal.sqlite").execute("SELECT count(*) FROM labels").fetchone() == (0,)
    # A journal named by --store that does not exist is not made by a label refused.
    for wanted in (run_id, "no-such-run"):
        out = cli("label", wanted, "--step", "1", "--expect", "accept", "--home", str(tmp_path / "third"),
                  "--store", f"sqlite:{tmp_path / 'new.sqlite'}")
        assert out.returncode == 2, out.stderr
        assert not (tmp_path / "new.sqlite").exists()


def test_text_that_is_not_utf8_is_bad_input(home_copy: Path) -> None:
    run_id = _run_of(home_copy, "happy-refund")
    for args, name in [(["label", "run\udcff", "--step", "1", "--expect", "accept"], "RUN_ID"),
                       (["label", run_id, "--step", "1", "--expect", "accept", "--note", "\udcff\udcfe"], "--note"),
                       (["show", "run\udcff"], "RUN_ID")]:
        out = cli(*args, "--home", str(home_copy))
        assert out.returncode == 2, out.stderr
        one_line(out.stderr, name, "expected UTF-8 text")
    # A path may hold such bytes: a suite file named so is read.
    suite = home_copy / "st\udcffrict.yaml"
    suite.write_bytes((REPO / "datasets" / "suites" / "strict.yaml").read_bytes())
    out = cli("replay", "--suite", str(suite), "--home", str(home_copy), "--fail-on", "never")
    assert out.returncode == 0, out.stderr


CONVERSATION = {
    "messages": [
        {"role": "user", "content": "Cancel order A"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "cancel_order", "arguments": '{"order_id": "A"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: order A not found"},
        {"role": "assistant", "content": "There is no order A."},
    ],
    "tools": [{"type": "function", "function": {"name": "cancel_order", "parameters": {"type": "object"}}}],
    "metadata": {"id": "conv-1", "task_id": "cancel/1"},
}


def test_an_imported_run_can_be_labelled(tmp_path: Path) -> None:
    """Imported runs live in the trace tables only; a label names them all the same."""
    import json

    source = tmp_path / "conversations.jsonl"
    source.write_text(json.dumps(CONVERSATION) + "\n")
    home = tmp_path / "home"
    assert cli("import", "openai-jsonl", str(source), "--home", str(home)).returncode == 0
    (run_id,) = pq.read_table(home / "traces" / "runs", columns=["run_id"]).column(0).to_pylist()
    out = cli("label", run_id, "--step", "1", "--validator", "tool_exists", "--expect", "reject",
              "--home", str(home))
    assert out.returncode == 0, out.stderr
    labels = pq.read_table(home / "traces" / "labels").to_pylist()
    assert [(row["run_id"], row["step"], row["validator"], row["expected_verdict"], row["source"])
            for row in labels] == [(run_id, 1, "tool_exists", "reject", "human")]
    # show lists the run's labels, in text and in JSON, as written (rich
    # would read "[/x]" as markup, and fail).
    assert cli("label", run_id, "--step", "1", "--expect", "reject", "--note", "[/x] [bold]as written\x1b[2J",
               "--home", str(home)).returncode == 0
    shown = cli("show", run_id, "--home", str(home))
    # ... and a terminal's control sequence written out, not sent to it.
    assert "[/x] [bold]as written\\x1b[2J" in shown.stdout and "\x1b" not in shown.stdout, shown.stderr
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if "tool_exists" in line and "human" in line]
    assert "reject" in row
    import json as json_

    document = json_.loads(cli("show", run_id, "--json", "--home", str(home)).stdout)
    assert [(lb["step"], lb["validator"], lb["expected_verdict"], lb["source"]) for lb in document["labels"]] == [
        (1, "tool_exists", "reject", "human"), (1, "", "reject", "human")]
    out = cli("label", run_id, "--step", "7", "--expect", "reject", "--home", str(home))
    assert out.returncode == 2
    one_line(out.stderr, "--step/--attempt", "no candidate at step 7")


# --- incomplete or inconsistent traces: named, never passed over -------------------------


def _rewrite(folder: Path, change) -> None:
    """Apply ``change(table) -> table`` to every Parquet file of a trace table."""
    for path in sorted(folder.rglob("*.parquet")):
        pq.write_table(change(pq.read_table(path)), path)


def _a_validated_run(traces: Path) -> str:
    import duckdb

    return duckdb.connect().execute(
        f"SELECT min(run_id) FROM read_parquet('{traces}/validations/*.parquet') WHERE validator = 'completion_gate'"
    ).fetchone()[0]


# Each spoils a copy of the traces and returns what the one line must name.


def _events_of_a_run_gone(traces: Path) -> list[str]:
    """Its recorded decisions would otherwise drop out of the comparison
    and the gate would pass on less than was recorded."""
    victim = _a_validated_run(traces)
    _rewrite(traces / "events", lambda t: t.filter(pc.field("run_id") != victim))
    return [victim, "events: none in the traces"]


def _one_event_gone(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)
    _rewrite(traces / "events", lambda t: t.filter(~((pc.field("run_id") == victim) & (pc.field("seq") == 3))))
    return [victim, "some are missing"]


def _events_written_twice(traces: Path) -> list[str]:
    first = sorted((traces / "events").glob("*.parquet"))[0]
    (traces / "events" / "copy").mkdir()
    shutil.copy(first, traces / "events" / "copy" / first.name)
    return ["repeated"]


def _events_cut_short(traces: Path) -> list[str]:
    """Only the run's first two events are left (created, first move): the
    seqs are whole, but no candidate the baseline decided on reaches
    VALIDATING any more."""
    victim = _a_validated_run(traces)
    _rewrite(traces / "events", lambda t: t.filter(~((pc.field("run_id") == victim) & (pc.field("seq") > 2))))
    return [victim, "never bring to VALIDATING"]


def _a_payload_not_json(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)

    def spoil(t: pa.Table) -> pa.Table:
        payloads = ["{not json" if r == victim else p
                    for r, p in zip(t.column("run_id").to_pylist(), t.column("payload_json").to_pylist())]
        return t.set_column(t.schema.get_field_index("payload_json"), "payload_json", pa.array(payloads))

    _rewrite(traces / "events", spoil)
    return [victim, "payload_json is not JSON"]


def _an_event(traces: Path, kind: str, column: str, value: Any, last: bool = False) -> str:
    """Set ``column`` of the first (or last) event of ``kind`` of a validated
    run (``value``: the new text, or a function of the old); return the run."""
    import duckdb

    victim = _a_validated_run(traces)
    (seq,) = duckdb.connect().execute(
        f"SELECT {'max' if last else 'min'}(seq) FROM read_parquet('{traces}/events/**/*.parquet') "
        "WHERE run_id = ? AND kind = ?", [victim, kind]).fetchone()

    def spoil(t: pa.Table) -> pa.Table:
        values = [(value(v) if callable(value) else value) if (r, q) == (victim, seq) else v for r, q, v in zip(
            t.column("run_id").to_pylist(), t.column("seq").to_pylist(), t.column(column).to_pylist())]
        return t.set_column(t.schema.get_field_index(column), column, pa.array(values, pa.string()))

    _rewrite(traces / "events", spoil)
    return victim


def _the_last_candidates_payload_not_json(traces: Path) -> list[str]:
    """Recorded after its candidate entered VALIDATING: no decision reads it,
    and it is still a trace that was changed."""
    return [_an_event(traces, "candidate_recorded", "payload_json", "{not json", last=True),
            "payload_json is not JSON"]


def _a_step_closed_payload_null(traces: Path) -> list[str]:
    return [_an_event(traces, "step_closed", "payload_json", "null"), "step_closed", "is null; expected a JSON object"]


def _the_last_step_closed_payload_empty(traces: Path) -> list[str]:
    """After the last candidate: read for the step table only, and still checked."""
    return [_an_event(traces, "step_closed", "payload_json", "{}", last=True), "step_closed", "run_id missing"]


def _a_step_closed_count_as_null(traces: Path) -> list[str]:
    def spoil(text: str) -> str:
        return json.dumps({**json.loads(text), "new_evidence": None})

    return [_an_event(traces, "step_closed", "payload_json", spoil, last=True), "new_evidence got null",
            "expected a whole number"]


def _a_step_closed_candidates_as_text(traces: Path) -> list[str]:
    def spoil(text: str) -> str:
        return json.dumps({**json.loads(text), "candidates": "3"})

    return [_an_event(traces, "step_closed", "payload_json", spoil), "candidates is not a whole number"]


def _a_decisions_payload_an_array(traces: Path) -> list[str]:
    return [_an_event(traces, "decisions", "payload_json", "[]"), "is an array; expected a JSON object"]


def _a_decisions_payload_empty(traces: Path) -> list[str]:
    return [_an_event(traces, "decisions", "payload_json", "{}"), "no verdict"]


def _a_candidate_recorded_payload_empty(traces: Path) -> list[str]:
    return [_an_event(traces, "candidate_recorded", "payload_json", "{}"), "could not be read back", "candidate_id"]


def _a_state_no_build_has(traces: Path) -> list[str]:
    return [_an_event(traces, "transition", "to_state", "BOGUS"), "'BOGUS' is not a valid State"]


def _seq_as_text(traces: Path) -> list[str]:
    victim = sorted((traces / "events").glob("*.parquet"))[0]
    t = pq.read_table(victim)
    pq.write_table(t.set_column(t.schema.get_field_index("seq"), "seq", t.column("seq").cast(pa.string())), victim)
    return [victim.name, "'seq'", "expected whole numbers"]


def _a_verdict_no_validator_gives(traces: Path) -> list[str]:
    victim = sorted((traces / "validations").glob("*.parquet"))[0]
    t = pq.read_table(victim)
    verdicts = ["bogus", *t.column("verdict").to_pylist()[1:]]
    pq.write_table(t.set_column(t.schema.get_field_index("verdict"), "verdict", pa.array(verdicts)), victim)
    return [victim.name, "'bogus'", "expected one of accept"]


def _the_runs_row_of_a_run_gone(traces: Path) -> list[str]:
    """Its events, candidates and decisions are all there: passed over, its
    decisions would drop out of the comparison unseen."""
    victim = _a_validated_run(traces)
    _rewrite(traces / "runs", lambda t: t.filter(pc.field("run_id") != victim))
    return [victim, "runs: no row for this run", "candidate(s)"]


def _only_the_decisions_of_a_run_left(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)
    for table in ("runs", "events", "candidates"):
        _rewrite(traces / table, lambda t: t.filter(pc.field("run_id") != victim))
    return [victim, "runs: no row for this run, which has decisions on"]


def _a_blocking_decision_gone(traces: Path) -> list[str]:
    """The loop validator's reject that stopped a run: without it the
    replay's own reject would read as a change, and a suite that drops the
    validator would pass the regression gate."""
    import duckdb

    victim, step = duckdb.connect().execute(
        f"SELECT run_id, step FROM read_parquet('{traces}/validations/*.parquet') WHERE verdict = 'reject'"
        " ORDER BY run_id, step LIMIT 1").fetchone()
    _rewrite(traces / "validations", lambda t: t.filter(
        ~((pc.field("run_id") == victim) & (pc.field("step") == step) & (pc.field("verdict") == "reject"))))
    return [victim, "recorded decisions are missing or changed"]


def _an_accept_row_gone(traces: Path) -> list[str]:
    """Lost, an accept would leave the replay's own verdict of that
    validator with nothing to compare with: a change, never a regression."""
    victim = _a_validated_run(traces)
    _rewrite(traces / "validations", lambda t: t.filter(
        ~((pc.field("run_id") == victim) & (pc.field("validator") == "structure") & (pc.field("step") == 1))))
    return [victim, "validator(s) decided on", "recorded decisions are missing"]


def _every_decision_of_a_run_gone(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)
    _rewrite(traces / "validations", lambda t: t.filter(pc.field("run_id") != victim))
    return [victim, "no recorded decision on", "recorded decisions are missing"]


def _an_accept_made_a_reject(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)

    def spoil(t: pa.Table) -> pa.Table:
        hit = [False]

        def flip(r: str, v: str, verdict: str) -> str:
            if r == victim and v == "structure" and not hit[0]:
                hit[0] = True
                return "reject"
            return verdict
        verdicts = [flip(r, v, x) for r, v, x in zip(t.column("run_id").to_pylist(), t.column("validator").to_pylist(),
                                                   t.column("verdict").to_pylist())]
        return t.set_column(t.schema.get_field_index("verdict"), "verdict", pa.array(verdicts))

    _rewrite(traces / "validations", spoil)
    return [victim, "recorded decisions"]


def _a_decision_recorded_twice_two_ways(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)
    t = pq.read_table(traces / "validations").filter(
        (pc.field("run_id") == victim) & (pc.field("validator") == "structure")).slice(0, 1)
    t = t.set_column(t.schema.get_field_index("verdict"), "verdict", pa.array(["reject"]))
    (traces / "validations" / "copy").mkdir()
    pq.write_table(t, traces / "validations" / "copy" / "again.parquet")
    return [victim, "two recorded decisions of structure", "disagree"]


def _a_runs_row_written_twice(traces: Path) -> list[str]:
    victim = _a_validated_run(traces)
    row = pq.read_table(traces / "runs").filter(pc.field("run_id") == victim)
    (traces / "runs" / "copy").mkdir()
    pq.write_table(row, traces / "runs" / "copy" / "again.parquet")
    return [victim, "runs: more than one row for this run"]


@pytest.mark.parametrize("spoil", [_events_of_a_run_gone, _one_event_gone, _events_written_twice, _events_cut_short,
                                   _a_payload_not_json, _the_last_candidates_payload_not_json,
                                   _a_step_closed_payload_null, _the_last_step_closed_payload_empty,
                                   _a_step_closed_count_as_null, _a_step_closed_candidates_as_text,
                                   _a_decisions_payload_an_array,
                                   _a_decisions_payload_empty, _a_candidate_recorded_payload_empty,
                                   _a_state_no_build_has, _seq_as_text, _a_verdict_no_validator_gives,
                                   _the_runs_row_of_a_run_gone, _only_the_decisions_of_a_run_left,
                                   _a_blocking_decision_gone, _an_accept_row_gone, _every_decision_of_a_run_gone,
                                   _an_accept_made_a_reject,
                                   _a_decision_recorded_twice_two_ways, _a_runs_row_written_twice])
def test_incomplete_or_inconsistent_traces_are_named_never_passed_over(home_copy: Path, spoil) -> None:
    names = spoil(home_copy / "traces")
    out = replay_on(home_copy, "--fail-on", "flips")
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, *names)


def test_a_baseline_replay_of_other_traces_is_refused(recorded_home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert cli("run", str(REPO_SCENARIOS / "happy-refund.yaml"), "--home", str(other)).returncode == 0
    common = ["--traces", str(recorded_home / "traces"), "--home", str(tmp_path)]
    assert cli("replay", "--suite", "default", *common).returncode == 0
    (first,) = [p.name for p in (tmp_path / "replays").iterdir()]
    # A replay id in this home, but the traces replayed now are another home's.
    out = cli("replay", "--suite", "default", "--baseline", first, "--traces", str(other / "traces"),
              "--home", str(tmp_path))
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, "--baseline", first, "covers none of the runs", "shares no run", str(recorded_home / "traces"))


def test_a_baseline_replay_that_could_replay_none_of_its_runs_is_refused(recorded_home: Path, tmp_path: Path) -> None:
    """It made no decision at all: it would compare nothing, and the gate
    would pass on nothing."""
    from loopledger.replay import replay

    broken = tmp_path / "broken"
    shutil.copytree(recorded_home / "traces", broken)
    _rewrite(broken / "events", lambda t: t.slice(0, 0))
    first = replay(broken, "default", write_to=tmp_path / "replays").summary
    assert first.decisions == 0 and first.run_errors == first.runs > 0
    out = cli("replay", "--suite", "default", "--baseline", first.replay_id, "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path))
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, "--baseline", first.replay_id, "covers none of the runs",
             f"{first.run_errors} of its {first.runs} run(s) could not be replayed")


def test_a_baseline_replay_whose_decisions_lost_rows_is_refused(recorded_home: Path, tmp_path: Path) -> None:
    """Its lost decisions would drop out of the comparison: the strict
    suite's flips would hide behind "not in the baseline" and the gate pass,
    or a lost objection would read as a fix. The summary's count says what
    the table held."""
    common = ["--traces", str(recorded_home / "traces"), "--home", str(tmp_path)]
    assert cli("replay", "--suite", "default", *common).returncode == 0
    (first,) = [p.name for p in (tmp_path / "replays").iterdir()]
    assert cli("replay", "--suite", "strict", "--baseline", first, "--fail-on", "flips", *common).returncode == 1
    folder = tmp_path / "replays" / first
    _rewrite(folder / "decisions", lambda t: t.slice(0, t.num_rows // 2))
    out = cli("replay", "--suite", "strict", "--baseline", first, "--fail-on", "flips", *common)
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, str(folder / "decisions"), first, "its summary counts", "its decisions table holds")
    shutil.rmtree(folder / "summary")
    (folder / "summary").mkdir()
    pq.write_table(pq.read_table(folder / "decisions").slice(0, 0), folder / "summary" / "part-0.parquet")
    out = cli("replay", "--suite", "strict", "--baseline", first, *common)
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, str(folder / "summary"), "no readable summary row")
    shutil.rmtree(folder / "summary")
    with pytest.raises(TracesError, match="has no summary table"):
        replay(recorded_home / "traces", "strict", baseline=first, write_to=tmp_path / "replays", workers=1)


def test_the_api_gate_fails_when_a_run_could_not_be_replayed(recorded_home: Path, tmp_path: Path) -> None:
    """As the command's gate reads "incomplete" (exit 2): passing on less
    than was recorded is no pass, whatever fail_on says."""
    from loopledger.replay import replay

    broken = tmp_path / "broken"
    shutil.copytree(recorded_home / "traces", broken)
    _rewrite(broken / "events", lambda t: t.slice(0, 0))
    result = replay(broken, "default", write_to=None)
    assert result.summary.run_errors > 0 and not result.failures("flips")
    assert [result.ok(fail_on) for fail_on in ("flips", "regressions", "never")] == [False, False, False]
    assert replay(recorded_home / "traces", "default", write_to=None).ok("flips")


def test_a_replays_folder_inside_the_traces_is_refused(home_copy: Path) -> None:
    from loopledger.replay import ReplayInputError, replay

    traces = home_copy / "traces"
    for inside in (traces, traces / "validations", traces / "runs" / "deeper"):
        with pytest.raises(ReplayInputError, match="write_to: .*the traces folder .*expected a folder outside it"):
            replay(traces, "default", write_to=inside)
    assert not list(traces.glob("*/r*-*")) and not (traces / "runs" / "deeper").exists()
    assert replay(traces, "default").summary.flips == 0  # the traces still read as they were


def test_runs_the_baseline_replay_never_decided_on_are_not_compared(home_copy: Path, tmp_path: Path) -> None:
    """The usual CI case: the traces grew after the baseline replay. What it
    never decided on is no flip, no divergence and never a failed gate; the
    summary and every report count it."""
    import json

    from loopledger.replay import read_summary

    common = ["--suite", "default", "--home", str(home_copy)]
    assert cli("replay", *common).returncode == 0
    (baseline,) = [p.name for p in (home_copy / "replays").iterdir()]
    added = cli("run", *(str(REPO_SCENARIOS / f"{name}.yaml") for name in ("model-unknown-tool",
                                                                           "permission-forbidden-path")),
                "--home", str(home_copy), "--json")
    assert added.returncode == 0, added.stderr
    new_runs = sorted(json.loads(line)["run_id"] for line in added.stdout.splitlines())
    out = cli("replay", *common, "--baseline", baseline, "--fail-on", "flips",
              "--markdown", str(tmp_path / "r.md"), "--junit", str(tmp_path / "r.xml"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Gate: pass" in out.stdout and "not compared, never a flip" in out.stdout
    (replayed,) = [p for p in (home_copy / "replays").iterdir() if p.name != baseline]
    summary = read_summary(replayed)
    assert (summary["flips"], summary["candidate_flips"], summary["changes"], summary["runs_diverged"]) == (0, 0, 0, 0)
    assert pq.read_table(replayed / "diffs").num_rows == 0
    rerun = pq.read_table(replayed / "decisions", columns=["run_id", "candidate_id"]).to_pylist()
    assert summary["not_in_baseline"] == len({r["candidate_id"] for r in rerun if r["run_id"] in new_runs}) > 0
    assert (f"| candidates not compared (not in the baseline replay) | {summary['not_in_baseline']} |"
            in (tmp_path / "r.md").read_text())
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert (suite.get("failures"), suite.get("skipped")) == ("0", "2")
    assert sorted(case.get("name") for case in suite.iter("testcase") if case.find("skipped") is not None) == new_runs


def test_an_unfinished_replay_is_never_offered_as_a_baseline(recorded_home: Path, tmp_path: Path) -> None:
    common = ["--traces", str(recorded_home / "traces"), "--home", str(tmp_path)]
    assert cli("replay", "--suite", "default", *common).returncode == 0
    (first,) = [p.name for p in (tmp_path / "replays").iterdir()]
    shutil.copytree(tmp_path / "replays" / first, tmp_path / "replays" / "r-broken.partial")
    for baseline in ("r-nope", "r-broken.partial"):
        out = cli("replay", "--suite", "default", "--baseline", baseline, *common)
        assert out.returncode == 2, out.stdout
        one_line(out.stderr, "--baseline", f"finished replays: {first}")
        assert "r-broken.partial" not in out.stderr.split("finished replays:")[1]


@pytest.mark.parametrize(
    ("suite", "files", "names"),
    [
        ("bad.yaml", {"bad.yaml": b"name: x\nvalidators:\n  - \xff\xfe\n"}, ["bad.yaml", "line 3", "not UTF-8"]),
        (":x", {}, [":x", "package.module:attr"]),
        ("boomsuite:suite", {"boomsuite.py": b"raise RuntimeError('boom')\n"},
         ["boomsuite:suite", "failed while importing", "RuntimeError: boom"]),
    ],
)
def test_suites_that_cannot_load_are_one_line(recorded_home: Path, tmp_path: Path, monkeypatch, suite: str,
                                              files: dict[str, bytes], names: list[str]) -> None:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = cli("replay", "--suite", suite, "--traces", str(recorded_home / "traces"), "--home", str(tmp_path))
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, *names)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_suite_module_in_the_working_directory_is_found(recorded_home: Path, tmp_path: Path, monkeypatch,
                                                         workers: str) -> None:
    """``--suite mysuites:strict`` run from the folder of mysuites.py, as
    ``python -m`` and pytest find a project's own modules (a console script
    does not put the working directory on the import path); worker
    processes find it too."""
    (tmp_path / "mysuites.py").write_text(
        "from loopledger.validators import parse_suite\n"
        "strict = parse_suite({'name': 'mine', 'validators': ['structure', 'completion_gate']})\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = cli("replay", "--suite", "mysuites:strict", "--traces", str(recorded_home / "traces"), "--home",
              str(tmp_path), "--fail-on", "never", "--workers", workers)
    assert out.returncode == 0, out.stderr
    (replay_dir,) = (tmp_path / "replays").iterdir()
    decided = pq.read_table(replay_dir / "decisions").column("validator").to_pylist()
    assert decided and sorted(set(decided)) == ["completion_gate", "structure"]


def test_a_report_path_the_system_refuses_is_bad_input_before_the_work(recorded_home: Path, tmp_path: Path) -> None:
    out = cli("replay", "--suite", "default", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--junit", "/proc/report.xml")
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, "--junit", "/proc/report.xml")
    assert not (tmp_path / "replays").exists()


def test_markdown_cells_hold_whatever_the_run_ids_hold() -> None:
    from loopledger.replay._report import _cell, _code

    assert _code("ten|ant`<x>") == "`` ten\\|ant`<x> ``"
    assert _code("plain") == "`plain`"
    assert _cell("a|b\nc") == "a\\|b c"
    # Control characters (a NUL, an escape sequence a terminal would act on) are written out.
    assert _cell("bad\x00code\x1b[31m") == "bad\\x00code\\x1b[31m"
    assert _code("x\x01y") == "`x\\x01y`"


def test_a_baseline_replay_that_decided_nothing_is_still_a_baseline(tmp_path: Path) -> None:
    """Runs that never validated a candidate give a replay with no
    decisions: it still is a replay of these traces."""
    home = tmp_path / "home"
    files = [str(REPO_SCENARIOS / f"{name}.yaml") for name in ("model-content-filter", "model-truncated-exhausted")]
    assert cli("run", *files, "--home", str(home)).returncode == 0
    assert cli("replay", "--suite", "default", "--home", str(home)).returncode == 0
    (first,) = [p.name for p in (home / "replays").iterdir()]
    out = cli("replay", "--suite", "default", "--baseline", first, "--fail-on", "flips", "--home", str(home))
    assert out.returncode == 0, out.stdout + out.stderr


def _with_a_label(traces: Path, source: str = "human") -> Path:
    """The labels file with one more row (a person's accept on the first
    decision); its path."""
    path = sorted((traces / "labels").glob("*.parquet"))[0]
    t = pq.read_table(path)
    d = pq.read_table(sorted((traces / "validations").glob("*.parquet"))[0]).slice(0, 1).to_pylist()[0]
    row = {name: None for name in t.column_names} | {k: d[k] for k in ("run_id", "step", "attempt", "candidate_id")}
    row |= {"validator": d["validator"], "expected_verdict": "accept", "source": source, "note": "",
            "schema_version": 1}
    pq.write_table(pa.concat_tables([t, pa.Table.from_pylist([row], schema=t.schema)]), path)
    return path


@pytest.mark.parametrize(("table", "column", "stats"), [
    ("runs", "run_id", True), ("events", "seq", True), ("candidates", "candidate_id", True),
    ("validations", "run_id", True), ("labels", "step", True), ("labels", "attempt", False),
])
def test_a_key_column_left_empty_is_named(home_copy: Path, table: str, column: str, stats: bool) -> None:
    """A row whose run id, seq, step or attempt is null cannot be placed:
    the file and the column are named, from the row groups' null counts,
    or by reading the column where the writer kept none (``stats`` False)."""

    traces = home_copy / "traces"
    path = _with_a_label(traces) if table == "labels" else sorted((traces / table).glob("*.parquet"))[0]
    t = pq.read_table(path)
    values = t.column(column).to_pylist()
    values[-1] = None
    pq.write_table(t.set_column(t.schema.get_field_index(column), column, pa.array(values, t.schema.field(column).type)),
                   path, write_statistics=stats)
    with pytest.raises(TracesError) as caught:
        replay(traces, "default", workers=1)
    assert path.name in str(caught.value) and f"column {column!r} is empty (null) in 1 row(s)" in str(caught.value)


def test_a_field_of_an_extra_struct_column_is_not_the_tables_column(home_copy: Path) -> None:
    """More columns are welcome (CONTRACT): a struct with a ``run_id`` of its
    own, null in one row, is not the table's ``run_id``; a null in the
    table's own is still found beside a clean struct field."""
    traces = home_copy / "traces"
    (path,) = list((traces / "runs").glob("*.parquet"))
    t = pq.read_table(path)
    ids = t.column("run_id").to_pylist()
    extra = pa.array([{"run_id": None if i == 0 else r} for i, r in enumerate(ids)])
    pq.write_table(t.add_column(0, "meta", extra), path)  # first: its field comes before the column
    assert replay(traces, "default", workers=1).summary.run_errors == 0
    clean = pa.array([{"run_id": r} for r in ids])
    pq.write_table(t.set_column(0, "run_id", pa.array([None, *ids[1:]], pa.string())).add_column(0, "meta", clean),
                   path)
    with pytest.raises(TracesError, match="column 'run_id' is empty"):
        replay(traces, "default", workers=1)


def test_damaged_pages_of_a_file_without_null_counts_are_named(home_copy: Path) -> None:
    """Without statistics the key columns are read: pages that cannot be
    read name their file, as anywhere else, not a DuckDB traceback."""
    traces = home_copy / "traces"
    victim = sorted((traces / "candidates").glob("*.parquet"))[0]
    pq.write_table(pq.read_table(victim), victim, write_statistics=False, compression="none")
    data = bytearray(victim.read_bytes())
    data[4:200] = bytes(b ^ 0xFF for b in data[4:200])  # the first pages, the footer kept
    victim.write_bytes(bytes(data))
    with pytest.raises(TracesError) as caught:
        replay(traces, "default", workers=1)
    assert victim.name in str(caught.value) and "not a readable Parquet file" in str(caught.value)


def test_a_null_run_id_is_one_line_from_the_command_line(home_copy: Path) -> None:
    (path,) = list((home_copy / "traces" / "runs").glob("*.parquet"))
    t = pq.read_table(path)
    pq.write_table(t.set_column(0, "run_id", pa.array([None, *t.column("run_id").to_pylist()[1:]], pa.string())), path)
    out = replay_on(home_copy)
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, path.name, "'run_id' is empty (null)")


def test_a_label_of_a_source_no_one_ranks_is_refused(home_copy: Path) -> None:
    """A label's source decides whose word wins (a person's over an
    import's over a scenario's): another source has no rank."""

    path = _with_a_label(home_copy / "traces", source="robot")
    with pytest.raises(TracesError) as caught:
        replay(home_copy / "traces", "default", workers=1)
    assert path.name in str(caught.value) and "source 'robot'; expected one of human" in str(caught.value)


def test_categorical_text_columns_are_text(home_copy: Path) -> None:
    """pandas, polars and pyarrow may write a text column dictionary-encoded."""
    (path,) = list((home_copy / "traces" / "runs").glob("*.parquet"))
    t = pq.read_table(path)
    index = t.schema.get_field_index("status")
    pq.write_table(t.set_column(index, "status", t.column("status").dictionary_encode()), path)
    assert pq.read_schema(path).field("status").type.value_type == pa.string()
    out = replay_on(home_copy, "--fail-on", "flips")
    assert out.returncode == 0, out.stdout + out.stderr



def test_the_gate_of_an_incomplete_replay_is_not_a_pass(home_copy: Path, tmp_path: Path) -> None:
    victim = _a_validated_run(home_copy / "traces")
    _rewrite(home_copy / "traces" / "runs", lambda t: t.filter(pc.field("run_id") != victim))
    out = replay_on(home_copy, "--markdown", str(tmp_path / "r.md"), "--junit", str(tmp_path / "r.xml"))
    assert out.returncode == 2
    assert "Gate: incomplete, 1 run(s) not replayed" in out.stdout and "Gate: pass" not in out.stdout
    assert "**Gate (`--fail-on regressions`): incomplete, 1 run(s) not replayed**" in (tmp_path / "r.md").read_text()
    errors = [case for case in ET.parse(tmp_path / "r.xml").iter("testcase") if case.find("error") is not None]
    assert [case.get("name") for case in errors] == [victim]


def test_one_file_for_both_reports_is_refused_before_the_work(recorded_home: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.out"
    out = cli("replay", "--suite", "default", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--junit", str(report), "--markdown", str(tmp_path / "." / "report.out"))
    assert out.returncode == 2, out.stdout
    one_line(out.stderr, "--markdown", "also the --junit report")
    assert not report.exists() and not (tmp_path / "replays").exists()


def test_run_ids_stay_whole_in_a_ci_log(recorded_home: Path, tmp_path: Path) -> None:
    """Output that is not a terminal (a CI log) is not cut to 80 columns."""
    out = cli("replay", "--suite", "strict", "--traces", str(recorded_home / "traces"), "--home", str(tmp_path),
              "--fail-on", "never", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    diverged = [line for line in out.stdout.splitlines() if "loop-repeated" in line]
    assert diverged and all("…" not in line for line in diverged)
    assert all(re.search(r"loop-repeated-[a-z]+\.v\d\.[0-9a-f]{8} ", line) for line in diverged), diverged


def test_labels_on_a_validator_the_suite_drops_count_and_are_not_agreed_with(recorded_home: Path,
                                                                            tmp_path: Path) -> None:
    import yaml

    from loopledger.replay import replay

    members = yaml.safe_load((REPO / "datasets" / "suites" / "default.yaml").read_text())["validators"]
    suite = tmp_path / "no-references.yaml"
    suite.write_text(yaml.safe_dump({"name": "no-references", "validators": [m for m in members
                                                                            if m != "references@1"]}))
    full = replay(recorded_home / "traces", "default", write_to=None).summary
    dropped = replay(recorded_home / "traces", str(suite), write_to=None).summary
    assert dropped.labels == full.labels > 0
    assert dropped.regressions > 0
    assert dropped.labels_agreeing == full.labels_agreeing - dropped.regressions


@pytest.mark.parametrize(("signum", "code", "said"), [(15, 143, "terminated"), (2, 130, "interrupted")])
def test_a_replay_ended_by_a_signal_says_so_and_leaves_nothing_unfinished(
        recorded_home: Path, tmp_path: Path, signum: int, code: int, said: str) -> None:
    """What a cancelled CI job or `timeout` sends (SIGTERM), or Ctrl-C: the
    replay unwinds, says so in one line, exits 143 (130), and leaves no
    ``<id>.partial`` nor work folder. (typer's own handling of Ctrl-C exited
    130 and said nothing.)"""
    import os
    import signal
    import subprocess
    import time

    from replay_kit import LOOPLEDGER

    (tmp_path / "slowmod.py").write_text(
        "import time\nfrom loopledger.validators import validator\n\n"
        "@validator(name='slow.sleep', version='1')\ndef sleep():\n"
        "    def check(inp):\n        time.sleep(0.05)\n        return []\n    return check\n")
    suite = tmp_path / "slow.yaml"
    suite.write_text("name: slow\nimports: [slowmod]\nvalidators: [structure, slow.sleep]\n")
    home = tmp_path / "home"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}, "PYTHONPATH": str(tmp_path)}
    # Ctrl-C's default, whatever the test runner's own is.
    proc = subprocess.Popen([LOOPLEDGER, "replay", "--suite", str(suite), "--traces", str(recorded_home / "traces"),
                             "--home", str(home), "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not list((home / "replays").glob("*.partial")) if (home / "replays").is_dir() else True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # well into the candidates
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, (out, err)
    assert err.strip() == f"loopledger: {said}"
    assert list((home / "replays").iterdir()) == []


def test_sigterm_inside_a_duckdb_query_is_terminated_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """DuckDB turns the exception a signal handler raises inside a query
    (partitioning the traces) into its own "Query interrupted" error. (Ctrl-C
    is left to the subprocess test above: in a test runner's worker, DuckDB
    does not always see a SIGINT sent to its own process.)"""
    signum, code, said = 15, 143, "terminated"
    import os
    import signal
    import sys
    import threading

    import duckdb

    import loopledger.replay._commands as commands
    from loopledger import _cli

    def slow_query(**_: object) -> int:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signum)).start()
        # Seconds of work, not hours: a signal that never lands fails the test, it does not hang it.
        duckdb.sql("SELECT count(*) FROM range(2000000000) t(x) WHERE x % 7 = 3").fetchall()
        return 0

    monkeypatch.setattr(commands, "replay_command", slow_query)
    monkeypatch.setattr(_cli, "_SIGNALLED", [])
    monkeypatch.setattr(sys, "argv", ["loopledger", "replay", "--suite", "default"])
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as ended:
            _cli.main()
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
    assert ended.value.code == code
    assert capsys.readouterr().err.strip() == f"loopledger: {said}"


def test_a_validator_of_an_interactive_session_is_not_sent_to_worker_processes(recorded_home: Path) -> None:
    """Defined in ``python -c`` (a REPL, a notebook): spawned workers cannot
    import it. Asked for workers, the replay says so; by itself it stays in
    the caller's process."""
    import subprocess
    import sys

    code = ("from loopledger.validators import parse_suite, validator\n"
            "from loopledger.replay import ReplayInputError, replay\n"
            "@validator(name='inline.check', version='1')\n"
            "def check():\n    return lambda inp: []\n"
            "suite = parse_suite({'name': 'inline', 'validators': ['structure', 'inline.check']})\n"
            f"traces = {str(recorded_home / 'traces')!r}\n"
            "try:\n    replay(traces, suite, write_to=None, workers=2)\n"
            "except ReplayInputError as exc:\n    print('refused:', exc)\n"
            "print('decisions:', replay(traces, suite, write_to=None).summary.decisions)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    refused, decided = done.stdout.splitlines()
    assert refused == ("refused: workers: inline.check is defined in this interactive session (python -c, a REPL, "
                       "a notebook), which worker processes cannot import; expected workers=1, or the validator in "
                       "a module")
    assert int(decided.removeprefix("decisions: ")) > 0
    assert done.stderr == ""
