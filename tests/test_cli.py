"""The command line as a user meets it: help, bad input, exit codes."""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOOPLEDGER = str(Path(sys.executable).with_name("loopledger"))
HEAVY = ("pyarrow", "duckdb", "polars", "streamlit")


def cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    full_env.update(env or {})
    return subprocess.run([LOOPLEDGER, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=300)


def assert_one_clear_line(stderr: str, *names: str) -> None:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_help_exits_0_and_lists_the_commands() -> None:
    result = cli("--help")
    assert result.returncode == 0, result.stderr
    for command in ("export", "demo"):
        assert command in result.stdout
    export_help = cli("export", "--help")
    assert export_help.returncode == 0
    assert "--home" in export_help.stdout and "--compact" in export_help.stdout


@pytest.mark.parametrize("args", [["--help"], ["export", "--help"], ["demo", "--help"]])
def test_help_does_not_import_heavy_libraries(args: list[str]) -> None:
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from loopledger._cli import app\n"
        f"result = CliRunner().invoke(app, {args!r})\n"
        "assert result.exit_code == 0, result.output\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("command", ["export", "demo"])
def test_a_home_that_is_a_file_is_bad_input(tmp_path: Path, command: str) -> None:
    not_a_dir = tmp_path / "home.txt"
    not_a_dir.write_text("I am a file")
    result = cli(command, "--home", str(not_a_dir))
    assert result.returncode == 2
    assert_one_clear_line(result.stderr, str(not_a_dir), "--home")
    assert not_a_dir.read_text() == "I am a file"


@pytest.mark.parametrize("args", [["export", "--home", ""], ["show", "r1", "--home="], ["resume", "--home", " "]])
def test_an_empty_home_is_bad_input_not_the_current_folder(tmp_path: Path, args: list[str]) -> None:
    """`--home ""` (an unset variable in a script) names no folder: the
    command refuses it instead of making the current folder a data directory."""
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert_one_clear_line(result.stderr, "--home", "empty")
    assert list(tmp_path.iterdir()) == []


def test_a_home_from_the_environment_that_is_a_file_is_bad_input(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "home.txt"
    not_a_dir.write_text("")
    result = cli("export", env={"LOOPLEDGER_HOME": str(not_a_dir)})
    assert result.returncode == 2
    assert_one_clear_line(result.stderr, str(not_a_dir))


def test_an_unsupported_store_url_is_bad_input(tmp_path: Path) -> None:
    result = cli("export", "--home", str(tmp_path / "home"), "--store", "mysql://db/x")
    assert result.returncode == 2
    assert_one_clear_line(result.stderr, "--store", "mysql://db/x")


@pytest.mark.parametrize("url", [
    "mysql://u:s3cr3tpw@h/db",
    "POSTGRESQL://u:s3cr3tpw@127.0.0.1:1/db",
    "host=127.0.0.1 password=s3cr3tpw",
    "redis://h/db?password=s3cr3tpw",
])
def test_an_unsupported_store_url_never_shows_its_password(tmp_path: Path, url: str) -> None:
    result = cli("export", "--home", str(tmp_path / "home"), "--store", url)
    assert result.returncode == 2
    assert_one_clear_line(result.stderr, "--store", "unsupported store URL", "***")
    assert "s3cr3tpw" not in result.stderr + result.stdout


def test_a_password_with_an_at_sign_is_masked_whole() -> None:
    from loopledger.engine._postgres import redact

    assert redact("postgresql://postgres:pa@ss@127.0.0.1:1/db") == "postgresql://postgres:***@127.0.0.1:1/db"
    assert redact("host=h password='a b' user=u") == "host=h password=*** user=u"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    # Unencoded ?, @ and / in a password: masked whole, up to the authority's last @.
    for password in ("Sup3r?Secret", "Hunter2@MySecretTail", "pa@ss/word", "pa/ss"):
        assert redact(f"postgresql://u:{password}@127.0.0.1:5432/db") == "postgresql://u:***@127.0.0.1:5432/db"
    assert redact("postgresql://h/db?sslmode=require&password=ed") == "postgresql://h/db?sslmode=require&password=***"
    assert redact("postgresql://u@h:5432/db?application_name=a@b") == "postgresql://u@h:5432/db?application_name=a@b"
    # Never a bare substring: a short password would mask parts of words, and give itself away.
    url = "postgresql://ll:ion@127.0.0.1:55433/j6"
    message = f"{url}: cannot open the journal: connection failed: password authentication failed"
    assert redact(message, url) == ("postgresql://ll:***@127.0.0.1:55433/j6: cannot open the journal: connection "
                                    "failed: password authentication failed")


@pytest.mark.parametrize("url", ["postgresql://ll:Qz7/Wx9@127.0.0.1:55433/j6", "postgresql://ll:Qz7?Wx9@127.0.0.1:1/j6",
                                 "postgresql://ll:Qz7@Wx9@127.0.0.1:notaport/db", "postgresql://ll:Qz7?Wx9@/j6"])
def test_a_store_url_libpq_misreads_never_shows_a_piece_of_its_password(tmp_path: Path, url: str) -> None:
    """A password with an unencoded / ? or @: libpq may take part of it for
    the port or the host, and say so; none of it is shown."""
    result = cli("show", "x", "--home", str(tmp_path / "home"), "--store", url)
    assert result.returncode in (2, 3), result.stderr
    assert not {"Qz7", "Wx9"} & set(re.findall(r"Qz7|Wx9", result.stderr + result.stdout)), result.stderr
    assert_one_clear_line(result.stderr, "***")


def test_a_journal_that_is_not_a_database_is_an_infrastructure_failure(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "journal.sqlite").write_bytes(b"this is not an SQLite file at all" * 100)
    result = cli("export", "--home", str(home))
    assert result.returncode == 3
    assert_one_clear_line(result.stderr, "journal")


@pytest.mark.parametrize("command", [["run"], ["demo"], ["resume"]])
def test_demo_backends_that_are_not_a_database_are_an_infrastructure_failure(tmp_path: Path,
                                                                            command: list[str]) -> None:
    """Exit 3, as for the journal: 1 would read as a failed check or a
    rejection, and nothing recorded in the journal is touched."""
    home = tmp_path / "home"
    scenario = tmp_path / "s.yaml"
    scenario.write_text("id: s\ncontract: {goal: hi}\nmodel: [{final: hello}]\n")
    assert cli("run", str(scenario), "--home", str(home)).returncode == 0
    runs = sqlite3.connect(home / "journal.sqlite").execute("SELECT run_id, state FROM runs").fetchall()
    (home / "demo_backend.sqlite").write_bytes(b"this is not an SQLite file at all" * 100)
    args = [*command, str(scenario)] if command == ["run"] else command
    result = cli(*args, "--home", str(home))
    assert result.returncode == 3, (result.returncode, result.stderr)
    assert_one_clear_line(result.stderr, "demo_backend.sqlite", "cannot open the demo backend")
    assert sqlite3.connect(home / "journal.sqlite").execute("SELECT run_id, state FROM runs").fetchall() == runs


def test_a_journal_damaged_inside_is_named_in_the_error(tmp_path: Path) -> None:
    """SQLite's errors do not name their file: the message does, so a user
    knows which of the home's databases to look at (here a page of rows
    damaged after the journal opened fine)."""
    home = tmp_path / "home"
    refund = Path(__file__).resolve().parents[1] / "datasets" / "scenarios" / "happy-refund.yaml"
    for _ in range(3):
        assert cli("run", str(refund), "--home", str(home)).returncode == 0
    journal = home / "journal.sqlite"
    with open(journal, "r+b") as handle:
        handle.seek(journal.stat().st_size // 2)
        handle.write(b"\x00garbage" * 512)
    (home / "traces").rename(home / "traces.old")  # so that the export reads every row
    result = cli("export", "--home", str(home))
    assert result.returncode == 3, result.stderr
    assert_one_clear_line(result.stderr, f"{journal}: ", "malformed")


def test_export_writes_every_table_of_an_empty_journal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    sqlite3.connect(home / "journal.sqlite").close()  # an empty file: the store makes its schema
    result = cli("export", "--home", str(home))
    assert result.returncode == 0, result.stderr
    for table in ("runs", "events", "artifacts", "candidates", "validations", "operations", "loop_diagnoses", "labels"):
        assert list((home / "traces" / table).glob("*.parquet")), table


def test_export_where_nothing_ran_makes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "typo"
    done = cli("export", "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert f"No journal at {home / 'journal.sqlite'}: nothing to export" in done.stdout
    assert not home.exists()


def test_export_through_a_mistyped_store_leaves_imported_traces_to_their_journal(tmp_path: Path) -> None:
    home, source = tmp_path / "home", tmp_path / "chat.jsonl"
    source.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "hello"}]}) + "\n")
    assert cli("import", "openai-jsonl", str(source), "--home", str(home)).returncode == 0
    typo = tmp_path / "nowhere" / "journal-typo.sqlite"
    done = cli("export", "--home", str(home), "--store", f"sqlite:{typo}")
    assert done.returncode == 0 and "nothing to export" in done.stdout, done.stdout + done.stderr
    assert not typo.parent.exists()
    # The home's own journal still exports to its traces, and labels them.
    assert cli("export", "--home", str(home)).returncode == 0
    run_id = scalar_run_id(home)
    labelled = cli("label", run_id, "--step", "1", "--expect", "accept", "--home", str(home))
    assert labelled.returncode == 0, labelled.stderr


def scalar_run_id(home: Path) -> str:
    import pyarrow.parquet as pq

    (path,) = [p for p in (home / "traces" / "runs").glob("*.parquet") if pq.read_metadata(p).num_rows]
    return pq.read_table(path, columns=["run_id"]).column(0)[0].as_py()


def test_home_defaults_to_the_environment_then_the_working_directory(tmp_path: Path) -> None:
    from_env = tmp_path / "from-env"
    scenario = str(REPO / "datasets" / "scenarios" / "happy-refund.yaml")
    assert cli("run", scenario, cwd=tmp_path, env={"LOOPLEDGER_HOME": str(from_env)}).returncode == 0
    assert (from_env / "journal.sqlite").is_file()
    assert not (tmp_path / "loopledger-data").exists()
    assert cli("run", scenario, cwd=tmp_path).returncode == 0
    assert (tmp_path / "loopledger-data" / "journal.sqlite").is_file()


def test_home_may_come_before_the_command_and_the_commands_own_wins(tmp_path: Path) -> None:
    scenario = str(REPO / "datasets" / "scenarios" / "happy-refund.yaml")
    before, own = tmp_path / "before", tmp_path / "own"
    assert cli("--home", str(before), "run", scenario, cwd=tmp_path).returncode == 0
    assert (before / "journal.sqlite").is_file() and not (tmp_path / "loopledger-data").exists()
    run_id = scalar_run_id(before)
    assert cli("--home", str(before), "show", run_id, cwd=tmp_path).returncode == 0
    assert cli("--home", str(before), "run", scenario, "--home", str(own), cwd=tmp_path).returncode == 0
    assert (own / "journal.sqlite").is_file()
    assert cli("--home", str(own), "show", run_id, cwd=tmp_path).returncode == 1  # not that home's run
    # A store given before the command is the command's journal too.
    shown = cli("--store", f"sqlite:///{before / 'journal.sqlite'}", "--home", str(own), "show", run_id,
                cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # A command without a journal of its own takes none: refused, not passed over.
    for command in (["replay", "--suite", "default"], ["import", "openai-jsonl", "x.jsonl"]):
        refused = cli("--store", "sqlite:///elsewhere.sqlite", "--home", str(before), *command, cwd=tmp_path)
        assert refused.returncode == 2
        assert_one_clear_line(refused.stderr, "bad input", "--store", command[0])


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["replay"], ["--suite", "loopledger replay --help"]),
        (["replay", "--suite", "default", "--bogus"], ["--bogus"]),
        (["replay", "--suite"], ["'--suite' requires an argument", "(see loopledger replay --help)"]),
        (["--home", "h", "run", "--prompt-version"], ["--prompt-version", "(see loopledger run --help)"]),
        (["nosuchcommand"], ["nosuchcommand"]),
        (["run", "x.yaml", "--concurrency", "0"], ["--concurrency", "greater than or equal to 1"]),
        (["run", "x.yaml", "--concurrency", "many"], ["--concurrency", "integer"]),
        (["import"], ["FORMAT"]),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path: Path, args: list[str], names: list[str]) -> None:
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert_one_clear_line(result.stderr, "bad input", *names)
    assert list(tmp_path.iterdir()) == []  # nothing recorded


def test_no_command_prints_the_help() -> None:
    result = cli()
    assert result.returncode == 2
    assert "Commands" in result.stdout and "run" in result.stdout


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"LOOPLEDGER_CRASH_AFTER_COMMITS": "abc"}, ["LOOPLEDGER_CRASH_AFTER_COMMITS", "whole number"]),
        ({"LOOPLEDGER_CRASH_AT": "nowhere"}, ["LOOPLEDGER_CRASH_AT", "after_dispatch, before_terminal"]),
        ({"LOOPLEDGER_NOW": "yesterday"}, ["LOOPLEDGER_NOW", "ISO-8601"]),
    ],
)
def test_a_testing_hook_that_cannot_mean_anything_is_refused_up_front(tmp_path: Path, env: dict[str, str],
                                                                       names: list[str]) -> None:
    scenario = Path(__file__).resolve().parents[1] / "datasets" / "scenarios" / "happy-refund.yaml"
    result = cli("run", str(scenario), "--home", str(tmp_path / "home"), env=env)
    assert result.returncode == 2
    assert_one_clear_line(result.stderr, "bad input", *names)
    assert not (tmp_path / "home").exists()


SCENARIOS = Path(__file__).resolve().parents[1] / "datasets" / "scenarios"

#: Loaded by Python at start-up (``sitecustomize``): the engine's drive
#: fails with an unexpected error for the runs of one task.
BREAK_ONE_TASK = """\
from loopledger.engine._controller import Controller

_drive = Controller.drive


def drive(self, run_id):
    if run_id.startswith("happy-read-file."):
        raise TypeError("an engine bug")
    return _drive(self, run_id)


Controller.drive = drive
"""


@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_stopped_by_an_engine_bug_is_one_line_exit_3_and_the_others_finish(tmp_path: Path,
                                                                                 as_json: bool) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(BREAK_ONE_TASK)
    files = [str(SCENARIOS / f"{name}.yaml") for name in ("happy-read-file", "happy-refund", "happy-list-then-read")]
    result = cli("run", *files, "--home", str(tmp_path / "home"), *(["--json"] if as_json else []),
                 env={"PYTHONPATH": str(hooks)})
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert_one_clear_line(result.stderr, "happy-read-file.", "stopped by an unexpected error",
                          "TypeError: an engine bug")
    # The other runs finished and are reported; the stopped one is shown where it stopped.
    if as_json:
        lines = {json.loads(line)["task_id"]: json.loads(line)["status"] for line in result.stdout.splitlines()}
        assert lines == {"happy-read-file": "READY", "happy-refund": "SUCCEEDED", "happy-list-then-read": "SUCCEEDED"}
    else:
        assert result.stdout.count("SUCCEEDED") == 2 and "READY" in result.stdout
    # resume meets the same bug: the same line, the same exit code, the run still where it was.
    again = cli("resume", "--home", str(tmp_path / "home"), env={"PYTHONPATH": str(hooks)})
    assert again.returncode == 3, (again.stdout, again.stderr)
    assert_one_clear_line(again.stderr, "happy-read-file.", "stays at its last committed state")


def test_run_and_resume_print_each_run_id_whole_in_a_log(tmp_path: Path) -> None:
    """Piped into a CI log (no terminal, 80 columns), each run's id stays on
    one line, so it can be copied into show, reply or cancel, or grepped."""
    home = tmp_path / "home"
    files = [str(SCENARIOS / f"{name}.yaml") for name in ("approval-waits-for-person", "happy-refund")]
    ran = cli("run", *files, "--home", str(home), env={"COLUMNS": "80"})
    resumed = cli("resume", "--home", str(home), env={"COLUMNS": "80"})
    assert ran.returncode == 0 and resumed.returncode == 0, (ran.stderr, resumed.stderr)
    ids = [r for (r,) in sqlite3.connect(home / "journal.sqlite").execute("SELECT run_id FROM runs")]
    assert len(ids) == 2 and max(map(len, ids)) > 30
    for run_id in ids:
        assert any(run_id in line.split() or f"│ {run_id} " in line for line in ran.stdout.splitlines()), ran.stdout
    waiting = next(r for r in ids if r.startswith("approval"))
    assert any(f"│ {waiting} " in line for line in resumed.stdout.splitlines()), resumed.stdout


def test_resume_says_which_runs_ended_and_which_still_wait(tmp_path: Path) -> None:
    """A run found waiting for a person and left waiting was not resumed: the
    title counts what happened, and a journal with no unfinished run says so."""
    home = tmp_path / "home"
    cli("run", str(SCENARIOS / "approval-waits-for-person.yaml"), "--home", str(home))
    resumed = cli("resume", "--home", str(home), env={"COLUMNS": "200"})
    assert resumed.returncode == 0, resumed.stderr
    assert "1 unfinished run(s): 0 ended, 1 still waiting" in resumed.stdout, resumed.stdout
    assert "resumed" not in resumed.stdout
    finished = tmp_path / "finished"
    cli("run", str(SCENARIOS / "happy-refund.yaml"), "--home", str(finished))
    nothing = cli("resume", "--home", str(finished))
    assert nothing.returncode == 0 and nothing.stdout.startswith("No unfinished run in "), nothing.stdout


def test_resume_drives_the_runs_it_can_and_names_those_whose_model_it_cannot_reach(tmp_path: Path) -> None:
    """One run on a real model route, one scripted, both killed mid-way;
    resumed where the route's key is not set: the scripted run finishes and
    is printed, the other is printed where it stays, and one line says why
    (exit 3: nothing wrong with the input, the environment lacks the key)."""
    home = str(tmp_path / "home")
    killed = {"LOOPLEDGER_CRASH_AFTER_COMMITS": "1"}
    real = cli("run", str(SCENARIOS / "happy-refund.yaml"), "--home", home, "--model", "openai:gpt-4.1",
               env={**killed, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    scripted = cli("run", str(SCENARIOS / "happy-read-file.yaml"), "--home", home, env=killed)
    assert real.returncode == scripted.returncode == -9, (real.stderr, scripted.stderr)
    resumed = cli("resume", "--home", home, "--json")
    assert resumed.returncode == 3, (resumed.stdout, resumed.stderr)
    lines = {json.loads(x)["task_id"]: json.loads(x) for x in resumed.stdout.splitlines()}
    assert lines["happy-read-file"]["status"] == "SUCCEEDED"
    assert lines["happy-refund"]["status"] not in ("SUCCEEDED", "FAILED")
    assert_one_clear_line(resumed.stderr, lines["happy-refund"]["run_id"], "was not resumed", "OPENAI_API_KEY")
    assert "--model" not in resumed.stderr


@pytest.mark.slow
def test_the_demo_runs_and_says_when_its_replays_cover_earlier_runs(tmp_path: Path) -> None:
    home = tmp_path / "my home"
    first = cli("demo", "--home", str(home), env={"COLUMNS": "400"})
    assert first.returncode == 0, first.stderr
    assert "114 of 114 runs ended as their scenario expects" in first.stdout
    assert "Replay with suite default" in first.stdout and "0 flip(s)" in first.stdout
    assert "Replay with suite strict" in first.stdout and f"loopledger ui --home '{home}'" in first.stdout
    # The commands it prints work when pasted into a shell, spaces and all.
    (inspect,) = [line for line in first.stdout.splitlines() if line.startswith("Inspect one run:")]
    command = shlex.split(inspect.split(":", 1)[1])
    assert command[:2] == ["loopledger", "show"] and command[-2:] == ["--home", str(home)]
    assert cli(*command[1:]).returncode == 0
    assert "not made by this demo" not in first.stdout
    second = cli("demo", "--home", str(home), env={"COLUMNS": "400"})
    assert second.returncode == 0, second.stderr
    assert "228, of which 114 were not made by this demo; give --home an empty folder" in second.stdout


@pytest.mark.parametrize(("url", "names"), [
    ("postgresql://u:s3cr3t@127.0.0.1:notaport/db", ["port 'notaport'", "expected a whole number"]),
    ("postgresql://u:s3cr3t@[::1", ["IPv6"]),
    ("postgresql://u@127.0.0.1/db?bogusopt=1", ["bogusopt"]),
    ("postgresql://u@127.0.0.1/db?sslmode=bogus", ["sslmode 'bogus'"]),
    ("postgresql://u:s3cr3t@127.0.0.1/db?connect_timeout=abc", ["connect_timeout 'abc'"]),
    ("postgresql://u:s3cr3t@127.0.0.1:99999/db", ["port '99999'", "from 1 to 65535"]),
    ("postgresql://u:s3cr3t@127.0.0.1:0/db", ["port '0'", "from 1 to 65535"]),
    ("sqlite:", ["'sqlite:' names no file"]),
])
def test_a_malformed_store_url_is_bad_input_not_a_server_failure(tmp_path: Path, url: str,
                                                                       names: list[str]) -> None:
    pytest.importorskip("psycopg")
    result = cli("export", "--home", str(tmp_path / "home"), "--store", url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert_one_clear_line(result.stderr, "--store", *names)
    assert "s3cr3t" not in result.stderr


ODD_VALIDATOR = '''
import datetime

from loopledger.validators import Issue, Verdict, validator


@validator(name="odd.dated", version="1")
def dated():
    def check(inp):
        return [Issue(Verdict.ASK, "dated", "when?", {"t": datetime.date(2024, 1, 1)})]
    return check
'''


def test_a_live_decision_that_cannot_be_recorded_is_its_validators_error(tmp_path: Path) -> None:
    """A user's validator whose evidence is not plain JSON (a date) does not
    stop the run: its decision is recorded as its own reject/validator_error,
    as a member that raises is (docs/validators.md), and the run goes on."""
    (tmp_path / "odd_checks.py").write_text(ODD_VALIDATOR)
    (tmp_path / "odd.yaml").write_text("name: odd\nimports: [odd_checks]\nvalidators:\n  - structure\n"
                                       "  - odd.dated\n  - completion_gate\n")
    scenario = (SCENARIOS / "happy-read-file.yaml").read_text() + "suite: odd.yaml\n"
    (tmp_path / "s.yaml").write_text(scenario)
    home = tmp_path / "home"
    result = cli("run", str(tmp_path / "s.yaml"), "--home", str(home), "--json",
                 env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, (result.stdout, result.stderr)
    (line,) = [json.loads(x) for x in result.stdout.splitlines()]
    assert line["status"] != "READY" and "Traceback" not in result.stderr
    rows = sqlite3.connect(home / "journal.sqlite").execute(
        "SELECT verdict, code, message FROM validations WHERE validator = 'odd.dated'").fetchall()
    assert rows and all(v == "reject" and c == "validator_error" for v, c, _ in rows)
    assert "its evidence is not plain JSON ($.t: date is not a JSON value)" in rows[0][2]


def test_run_json_writes_each_runs_line_when_it_settles(tmp_path: Path) -> None:
    """A resume token is shown once: a process killed later in its batch has
    already written the lines (and tokens) of the runs that settled."""
    scenarios = REPO / "datasets" / "scenarios"
    home = tmp_path / "home"
    died = cli("run", str(scenarios / "approval-waits-for-person.yaml"), str(scenarios / "happy-refund.yaml"),
               "--json", "--concurrency", "1", "--home", str(home), env={"LOOPLEDGER_CRASH_AT": "before_terminal"})
    assert died.returncode == -9, died.stderr
    (line,) = [json.loads(x) for x in died.stdout.splitlines()]
    assert line["task_id"] == "approval-waits-for-person" and line["waiting"]["resume_token"]
    states = dict(sqlite3.connect(home / "journal.sqlite").execute("SELECT task_id, state FROM runs"))
    assert states == {"approval-waits-for-person": "WAITING_USER", "happy-refund": "FINALIZING"}


def test_run_json_into_a_closed_pipe_finishes_its_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    reader = subprocess.Popen(["head", "-c", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    writer = subprocess.run([LOOPLEDGER, "run", str(REPO / "datasets" / "scenarios"), "--json", "--home", str(home)],
                            stdout=reader.stdin, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    reader.stdin.close()
    reader.wait()
    assert writer.returncode == 0, writer.stderr
    left = sqlite3.connect(home / "journal.sqlite").execute(
        "SELECT count(*) FROM runs WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'BUDGET_EXHAUSTED', 'POLICY_STOPPED', "
        "'CANCELLED', 'CANCEL_UNKNOWN', 'EXPIRED', 'WAITING_USER')").fetchone()
    assert left == (0,)


def test_run_creates_its_batch_in_one_commit(tmp_path: Path) -> None:
    """Killed while making its runs, ``run`` leaves all of them or none: a
    part would be driven by a resume while the rest were never run."""
    home = tmp_path / "home"
    died = cli("run", str(REPO / "datasets" / "scenarios"), "--home", str(home), "--concurrency", "1",
               env={"LOOPLEDGER_CRASH_AFTER_COMMITS": "1"})
    assert died.returncode == -9, died.stderr
    made = sqlite3.connect(home / "journal.sqlite").execute("SELECT count(*), max(state_version) FROM runs").fetchone()
    assert made == (len(list((REPO / "datasets" / "scenarios").glob("*.yaml"))), 1)


def test_traces_of_another_journal_are_one_line_exit_3_for_the_engine(tmp_path: Path) -> None:
    home = tmp_path / "home"
    scenario = str(REPO / "datasets" / "scenarios" / "happy-refund.yaml")
    assert cli("run", scenario, "--home", str(home)).returncode == 0
    for path in home.glob("journal.sqlite*"):
        path.unlink()  # a new journal beside the old one's traces
    for args in (["run", scenario], ["resume"]):
        done = cli(*args, "--home", str(home))
        assert done.returncode == 3, (args, done.stderr)
        assert_one_clear_line(done.stderr, f"{home / 'traces'}: these traces were exported from another journal")


def test_resume_where_nothing_ran_makes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "typo"
    done = cli("resume", "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert "nothing to resume" in done.stdout
    assert not home.exists()
    assert cli("resume", "--json", "--home", str(home)).stdout == ""


def test_engine_commands_do_not_import_the_columnar_libraries() -> None:
    """The engine's commands (run, reply, show of a journal run, ...) load
    the validators but not their batch form: polars, pyarrow, duckdb and
    pandas are imported when a command reads or writes Parquet, not before."""
    code = ("import sys, loopledger.engine, loopledger.validators; "
            "print(sorted(m for m in ('polars', 'pyarrow', 'duckdb', 'pandas', 'streamlit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_writing_the_traces_does_not_import_pandas(tmp_path: Path) -> None:
    """A run ends with an export, which builds its Arrow columns without
    pandas (a third of a second of start-up in every command that writes
    the traces)."""
    code = ("import sys\nfrom loopledger._cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(sorted(m for m in ('pyarrow', 'pandas') if m in sys.modules))")
    scenario = REPO / "datasets" / "scenarios" / "happy-refund.yaml"
    out = subprocess.run([sys.executable, "-c", code, "run", str(scenario), "--home", str(tmp_path / "home")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['pyarrow']", out.stdout
    assert list((tmp_path / "home" / "traces" / "runs").glob("*.parquet")), "the run was exported"


def test_runs_lists_the_journals_runs_and_what_the_waiting_ones_wait_for(tmp_path: Path) -> None:
    home = tmp_path / "home"
    empty = cli("runs", "--home", str(home))
    assert empty.returncode == 0 and "No run (SQLite journal in" in empty.stdout
    assert not home.exists(), "listing creates no journal"
    scenarios = REPO / "datasets" / "scenarios"
    started = cli("run", str(scenarios / "approval-waits-for-person.yaml"), str(scenarios / "happy-read-file.yaml"),
                  "--json", "--home", str(home))
    assert started.returncode == 0, started.stderr
    ran = {json.loads(x)["task_id"]: json.loads(x) for x in started.stdout.splitlines()}
    token = ran["approval-waits-for-person"]["waiting"]["resume_token"]

    every = [json.loads(x) for x in cli("runs", "--json", "--home", str(home)).stdout.splitlines()]
    assert sorted((x["task_id"], x["status"]) for x in every) == [
        ("approval-waits-for-person", "WAITING_USER"), ("happy-read-file", "SUCCEEDED")]
    (waiting,) = [json.loads(x) for x in cli("runs", "--status", "waiting_user", "--json", "--home",
                                               str(home)).stdout.splitlines()]
    assert waiting["run_id"] == ran["approval-waits-for-person"]["run_id"] and waiting["ended_at"] is None
    wait = waiting["waiting"]
    assert wait["kind"] == "approval" and wait["approval_id"] == ran["approval-waits-for-person"]["waiting"][
        "approval_id"]
    assert wait["expires_at"] == ran["approval-waits-for-person"]["waiting"]["expires_at"]
    assert wait["question"].startswith("Approve deploy.service")
    assert wait["reason"] == "permission: call 'call_1_1_1': deploy.service needs a person's approval"
    table = cli("runs", "--home", str(home), env={"COLUMNS": "300"})
    assert table.returncode == 0 and "2 run(s)" in table.stdout and "approval: Approve deploy.service" in table.stdout
    shown = table.stdout + json.dumps(every)
    assert token not in shown and "token_hash" not in shown
    bad = cli("runs", "--status", "DONE", "--home", str(home))
    assert bad.returncode == 2
    assert_one_clear_line(bad.stderr, "--status", "expected a run state", "'DONE'")


def test_a_reader_that_goes_away_ends_the_command_as_sigpipe_would(tmp_path: Path) -> None:
    """``loopledger run ... | head -1``, ``show ... | head -1``: rich ended
    the command with exit 1, which means a failed check for ``run`` and an
    unknown run for ``show``. Now 141 (as a shell says of a command SIGPIPE
    ended), nothing on stderr, and what was recorded stands."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}

    def gone_reader(*args: str) -> subprocess.CompletedProcess[str]:
        read_end, write_end = os.pipe()
        os.close(read_end)  # every write to stdout meets EPIPE
        try:
            return subprocess.run([LOOPLEDGER, *args, "--home", str(home)], stdout=write_end, stderr=subprocess.PIPE,
                                  text=True, env=env, timeout=300)
        finally:
            os.close(write_end)

    ran = gone_reader("run", str(REPO / "datasets" / "scenarios" / "happy-refund.yaml"), "--check")
    assert (ran.returncode, ran.stderr) == (141, "")
    ((run_id, status),) = sqlite3.connect(home / "journal.sqlite").execute("SELECT run_id, state FROM runs").fetchall()
    assert status == "SUCCEEDED"
    shown = gone_reader("show", run_id)
    assert (shown.returncode, shown.stderr) == (141, "")
