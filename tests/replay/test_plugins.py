"""A user's own validators in a YAML suite: registered by an installed
distribution's entry point (group ``loopledger.validators``), or imported by
the suite's ``imports``. The distribution here is a real one to
``importlib.metadata``: a package and its ``.dist-info`` on PYTHONPATH."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from replay_kit import cli

PLUGIN = '''
from loopledger.validators import Issue, Verdict, validator


@validator(name="acme.refund_limit", version="1")
def refund_limit(*, max_amount: float = 100.0):
    def check(inp):
        return [Issue(Verdict.ASK, "refund_over_limit", "needs a person", {"call_id": c.call_id})
                for c in inp.proposed_calls
                if c.tool == "payments.refund" and c.arguments.get("amount", 0) > max_amount]
    return check
'''

SUITE = """
name: acme
{imports}validators:
  - structure
  - tool_exists
  - acme.refund_limit: {{max_amount: 10.0}}
"""


def install(site: Path, module: str = "acme_checks", body: str = PLUGIN, entry_point: bool = True) -> Path:
    """``module`` as a package in ``site``, with a distribution's metadata
    naming it in the entry-point group when ``entry_point``."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(body)
    if entry_point:
        info = site / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[loopledger.validators]\nacme = {module}\n")
    return site


def suite(tmp_path: Path, imports: str = "") -> Path:
    path = tmp_path / "acme.yaml"
    path.write_text(SUITE.format(imports=imports))
    return path


def acme_decisions(home: Path) -> dict[str, int]:
    (replay,) = [p for p in (home / "replays").iterdir() if p.is_dir()]
    rows = duckdb.sql(f"SELECT verdict, count(*) FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'acme.refund_limit' GROUP BY verdict").fetchall()
    return dict(rows)


def test_an_installed_plugins_validator_is_used_by_name(recorded_home: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site")
    out = cli("replay", "--suite", str(suite(tmp_path)), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--fail-on", "never", env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    verdicts = acme_decisions(tmp_path / "out")
    assert verdicts.get("ask", 0) > 0 and verdicts.get("accept", 0) > 0
    # Without the plugin the name is unknown, and said so in one line.
    missing = cli("replay", "--suite", str(suite(tmp_path)), "--traces", str(recorded_home / "traces"),
                  "--home", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert "validators[2]: unknown validator 'acme.refund_limit'" in missing.stderr


def test_a_suite_imports_the_module_of_its_own_validators(recorded_home: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site", entry_point=False)
    out = cli("replay", "--suite", str(suite(tmp_path, "imports: [acme_checks]\n")),
              "--traces", str(recorded_home / "traces"), "--home", str(tmp_path / "out"), "--fail-on", "never",
              env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    assert acme_decisions(tmp_path / "out").get("ask", 0) > 0


def test_a_suite_finds_the_module_of_its_validators_beside_it(recorded_home: Path, tmp_path: Path) -> None:
    """A module beside the suite file needs no PYTHONPATH (as a script's
    modules beside it), from any working folder, in the replay's worker
    processes too; one neither there nor on the path is still one line."""
    folder = tmp_path / "ci"
    folder.mkdir()
    (folder / "acme_beside.py").write_text(PLUGIN.replace("acme.refund_limit", "acme.beside_limit"))
    path = folder / "acme.yaml"
    path.write_text(SUITE.format(imports="imports: [acme_beside]\n").replace("acme.refund_limit",
                                                                           "acme.beside_limit"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = cli("replay", "--suite", os.path.relpath(path, elsewhere), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--fail-on", "never", "--workers", "2", cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    (replay,) = [p for p in (tmp_path / "out" / "replays").iterdir() if p.is_dir()]
    asks = duckdb.sql(f"SELECT count(*) FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'acme.beside_limit' AND verdict = 'ask'").fetchone()[0]
    assert asks > 0
    path.write_text(SUITE.format(imports="imports: [acme_nowhere]\n"))
    missing = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"),
                  "--home", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert "imports[0]: cannot import module 'acme_nowhere'" in missing.stderr


@pytest.mark.parametrize(("imports", "body", "said"), [
    ("imports: [no_such_module]\n", None, "imports[0]: cannot import module 'no_such_module'"),
    ("imports: acme_checks\n", None, "imports: expected a list of module names"),
    ("imports: [acme_checks]\n", "raise RuntimeError('boom')\n",
     "imports[0]: module 'acme_checks' failed while importing: RuntimeError: boom"),
    ("", "raise RuntimeError('boom')\n", "entry point 'acme_checks' of group loopledger.validators failed to "
                                         "import: RuntimeError: boom"),
])
def test_a_module_of_validators_that_cannot_load_is_one_line(recorded_home: Path, tmp_path: Path, imports: str,
                                                             body: str | None, said: str) -> None:
    site = install(tmp_path / "site", body=body or PLUGIN, entry_point=not imports)
    out = cli("replay", "--suite", str(suite(tmp_path, imports)), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), env={"PYTHONPATH": str(site)})
    assert out.returncode == 2, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "acme.yaml" in lines[0], out.stderr


def test_a_plugins_decision_can_be_labelled(home_copy: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site")
    run_id = duckdb.sql(f"SELECT min(run_id) FROM '{home_copy}/traces/candidates/*.parquet' "
                        "WHERE items_json LIKE '%payments.refund%'").fetchone()[0]
    step = duckdb.sql(f"SELECT min(step) FROM '{home_copy}/traces/candidates/*.parquet' "
                      f"WHERE run_id = '{run_id}' AND items_json LIKE '%payments.refund%'").fetchone()[0]
    out = cli("label", run_id, "--step", str(step), "--validator", "acme.refund_limit", "--expect", "ask",
              "--home", str(home_copy), env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    labels = duckdb.sql(f"SELECT validator, expected_verdict FROM '{home_copy}/traces/labels/*.parquet' "
                        "WHERE source = 'human'").fetchall()
    assert labels == [("acme.refund_limit", "ask")]


def test_a_validator_of_a_suites_imports_is_labelled_with_the_suite(home_copy: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site", entry_point=False)  # known only through the suite's imports
    run_id, step = duckdb.sql(f"SELECT run_id, step FROM '{home_copy}/traces/candidates/*.parquet' "
                              "WHERE items_json LIKE '%payments.refund%' ORDER BY run_id, step LIMIT 1").fetchone()
    args = ["label", run_id, "--step", str(step), "--validator", "acme.refund_limit", "--expect", "ask",
            "--home", str(home_copy)]
    refused = cli(*args, env={"PYTHONPATH": str(site)})
    assert refused.returncode == 2
    assert "unknown validator 'acme.refund_limit'" in refused.stderr and "--suite" in refused.stderr
    out = cli(*args, "--suite", str(suite(tmp_path, "imports: [acme_checks]\n")), env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    labels = duckdb.sql(f"SELECT validator, expected_verdict FROM '{home_copy}/traces/labels/*.parquet' "
                        "WHERE source = 'human'").fetchall()
    assert labels == [("acme.refund_limit", "ask")]


UNRECORDABLE = '''
import datetime

from loopledger.validators import Issue, Verdict, validator


def _member(name, verdict=Verdict.REJECT, code="odd", evidence=None):
    @validator(name=f"odd.{name}", version="1")
    def factory():
        def check(inp):
            return [Issue(verdict, code, "m", evidence or {})]
        return check


_member("date", evidence={"t": datetime.date(2024, 1, 1)})
_member("set", evidence={"s": {1, 2}})
_member("nan", evidence={"n": float("nan")})
_member("surrogate", evidence={"k": "\\ud800"})
_member("verdict", verdict="maybe")
_member("as_string", verdict="reject")  # the string of a verdict is that verdict
_member("code", code=7)
'''
#: member -> (the field that cannot be recorded, what is wrong with it)
ODD_MEMBERS = {"date": ("evidence", "is not plain JSON ($.t: date is not a JSON value)"),
               "set": ("evidence", "is not plain JSON ($.s: set is not a JSON value)"),
               "nan": ("evidence", "is not plain JSON ($.n: nan is not a JSON number)"),
               "surrogate": ("evidence", "is not plain JSON ($: string is not valid Unicode (surrogates not allowed))"),
               "verdict": ("verdict", "'maybe' is not a Verdict (or one of the strings accept, repair, ask, "
                                      "reject)"),
               "code": ("code", "7 is not Unicode text")}


def test_a_decision_that_cannot_be_recorded_is_its_validators_error(recorded_home: Path, tmp_path: Path) -> None:
    """Like a member that raises (docs/validators.md): its decision becomes
    reject/validator_error naming the problem, and the replay goes on."""
    site = install(tmp_path / "site", module="odd_checks", body=UNRECORDABLE, entry_point=False)
    path = tmp_path / "odd.yaml"
    path.write_text("name: odd\nimports: [odd_checks]\nvalidators:\n  - structure\n  - odd.as_string\n"
                    + "".join(f"  - odd.{name}\n" for name in ODD_MEMBERS))
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"), "--home",
              str(tmp_path / "out"), "--fail-on", "never", "--markdown", str(tmp_path / "r.md"),
              env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    assert "Gate: pass" in out.stdout and (tmp_path / "r.md").is_file()
    (replay,) = (tmp_path / "out" / "replays").iterdir()
    rows = duckdb.sql(f"SELECT DISTINCT validator, verdict, code, message, evidence_json "
                      f"FROM '{replay}/decisions/*.parquet' WHERE validator LIKE 'odd.%' "
                      "AND validator != 'odd.as_string'").fetchall()
    assert duckdb.sql(f"SELECT DISTINCT verdict, code FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'odd.as_string'").fetchall() == [("reject", "odd")]
    assert sorted(rows) == sorted(
        (f"odd.{name}", "reject", "validator_error", f"odd.{name} gave a decision that cannot be recorded: its "
         f"{field} {said}", f'{{"unrecordable":"{field}"}}') for name, (field, said) in ODD_MEMBERS.items())
    # The other members still decide.
    assert duckdb.sql(f"SELECT count(*) FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'structure' AND verdict = 'accept'").fetchone()[0] > 0


BRACKETS = '''
from loopledger.validators import Issue, Verdict, validator


@validator(name="acme.brackets", version="1")
def brackets():
    def check(inp):
        return [Issue(Verdict.REJECT, "[/odd]", "[bold]not markup", {})]
    return check
'''


def test_what_a_validator_writes_is_printed_as_written(recorded_home: Path, tmp_path: Path) -> None:
    """A code or message that rich would read as markup (``[/odd]`` fails
    to parse) is shown literally by replay's summary and by show."""
    site = install(tmp_path / "site", module="bracket_checks", body=BRACKETS, entry_point=False)
    path = tmp_path / "brackets.yaml"
    path.write_text("name: '[red]brackets'\nimports: [bracket_checks]\nvalidators:\n  - structure\n"
                    "  - acme.brackets\n")
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"), "--home",
              str(tmp_path / "out"), "--fail-on", "never", env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    assert "[/odd]" in out.stdout and "[red]brackets" in out.stdout


BROKEN = '''
import os
import sys

from loopledger.validators import Issue, Verdict, validator


@validator(name="bad.factory_raises", version="1")
def factory_raises():
    raise RuntimeError("factory broke")


@validator(name="bad.returns_nothing", version="1")
def returns_nothing():
    return 42


@validator(name="bad.free", version="1")
def free(*, n=3):
    def check(inp):
        return []
    return check


@validator(name="bad.exits", version="1")
def exits():
    def check(inp):
        sys.exit(7)
    return check


@validator(name="bad.kills_its_worker", version="1")
def kills_its_worker():
    def check(inp):
        import multiprocessing
        if multiprocessing.parent_process() is not None:  # only in a replay's worker process
            os._exit(9)
        return []
    return check


def make():
    """A suite whose validator is registered when the suite is made."""
    @validator(name="lazy.check", version="1")
    def lazy():
        def check(inp):
            return [Issue(Verdict.REPAIR, "lazy", "made by make()")] if inp.step == 1 else []
        return check
    return {"name": "lazy", "validators": ["structure", "lazy.check"]}
'''


@pytest.mark.parametrize(("suite_text", "said"), [
    ("validators: [structure, bad.factory_raises]",
     "validators[1].bad.factory_raises: the validator's factory raised RuntimeError: factory broke"),
    ("validators: [structure, bad.returns_nothing]",
     "validators[1].bad.returns_nothing: its factory returned 42; expected a check function"),
    ("validators: [structure, {bad.free: {n: .inf}}]", "validators[1].bad.free.n: expected plain JSON"),
    ("validators: [structure, {bad.free: {n: !!binary aGk=}}]", "a !!binary value; expected JSON values only"),
    ("validators: [structure, {output_rules: {custom: {5: abc}}}]",
     "validators[1].output_rules.custom: expected plain JSON"),
    ("validators: [structure, {version: '1'}]", "validators[1].name: missing"),
    ("description: 5\nvalidators: [structure]", "description: expected a string, got int"),
])
def test_a_suite_whose_plugin_or_params_are_broken_is_one_line(recorded_home: Path, tmp_path: Path,
                                                              suite_text: str, said: str) -> None:
    site = install(tmp_path / "site", module="broken_checks", body=BROKEN, entry_point=False)
    path = tmp_path / "broken.yaml"
    path.write_text(f"name: broken\nimports: [broken_checks]\n{suite_text}\n")
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), env={"PYTHONPATH": str(site)})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "broken.yaml" in lines[0], out.stderr
    assert not (tmp_path / "out" / "replays").exists() or not any((tmp_path / "out" / "replays").iterdir())


@pytest.mark.parametrize(("ref", "said"), [
    ("os.path:join", "os.path:join: calling join (expected to return a Suite or a suite mapping, with no "
                     "arguments) raised TypeError"),
    ("broken_checks:make_nothing", "broken_checks:make_nothing: module 'broken_checks' has no attribute"),
])
def test_a_suite_object_that_cannot_be_made_is_one_line(recorded_home: Path, tmp_path: Path, ref: str,
                                                        said: str) -> None:
    site = install(tmp_path / "site", module="broken_checks", body=BROKEN, entry_point=False)
    out = cli("replay", "--suite", ref, "--traces", str(recorded_home / "traces"), "--home", str(tmp_path / "out"),
              env={"PYTHONPATH": str(site)})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], out.stderr


def test_a_version_that_is_not_a_string_is_refused_when_registered(tmp_path: Path) -> None:
    from loopledger.validators import RegistryError, validator

    for name, version in (("x.int_version", 1), ("x.empty", ""), ("x@pinned", "1"), (" x.spaced", "1")):
        with pytest.raises(RegistryError, match="expected a non-empty string"):
            validator(name=name, version=version)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_suite_made_by_a_callable_that_registers_validators(recorded_home: Path, tmp_path: Path,
                                                              workers: str) -> None:
    """The callable runs once per process: the caller's process replays with
    the suite it made, and does not make it (register its validator) twice."""
    site = install(tmp_path / "site", module="broken_checks", body=BROKEN, entry_point=False)
    out = cli("replay", "--suite", "broken_checks:make", "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--workers", workers, "--fail-on", "never",
              env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    (replay,) = (tmp_path / "out" / "replays").iterdir()
    assert duckdb.sql(f"SELECT count(*) FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'lazy.check' AND code = 'lazy'").fetchone()[0] > 0


def test_a_check_that_exits_is_its_validators_error(recorded_home: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site", module="broken_checks", body=BROKEN, entry_point=False)
    path = tmp_path / "exits.yaml"
    path.write_text("name: exits\nimports: [broken_checks]\nvalidators: [structure, bad.exits]\n")
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--fail-on", "never", "--workers", "1", env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    (replay,) = (tmp_path / "out" / "replays").iterdir()
    assert duckdb.sql(f"SELECT DISTINCT verdict, code, message FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'bad.exits'").fetchall() == [
        ("reject", "validator_error", "bad.exits raised SystemExit: 7")]


def test_a_worker_process_that_dies_is_one_line_and_writes_nothing(recorded_home: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site", module="broken_checks", body=BROKEN, entry_point=False)
    path = tmp_path / "dies.yaml"
    path.write_text("name: dies\nimports: [broken_checks]\nvalidators: [structure, bad.kills_its_worker]\n")
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--workers", "2", env={"PYTHONPATH": str(site)})
    assert out.returncode == 3, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "a replay worker process ended abruptly" in lines[0], out.stderr
    assert not [p for p in (tmp_path / "out" / "replays").iterdir() if not p.name.startswith(".")]


def test_a_named_pipe_is_not_read_as_a_suite(recorded_home: Path, tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "fifo.yaml")
    out = cli("replay", "--suite", str(tmp_path / "fifo.yaml"), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"))
    assert out.returncode == 2 and "fifo.yaml: not a regular file" in out.stderr, out.stderr


def test_a_broken_installed_plugin_only_matters_to_names_it_could_give(recorded_home: Path, tmp_path: Path) -> None:
    """Entry points are imported the first time a name is not known: a
    broken one does not stop suites of built-in or imported validators, and
    is named where a validator could only have come from it."""
    site = install(tmp_path / "site", body="raise RuntimeError('boom')\n")
    install(site, module="broken_checks", body=BROKEN, entry_point=False)
    env = {"PYTHONPATH": str(site)}
    ok = cli("replay", "--suite", "default", "--traces", str(recorded_home / "traces"),
             "--home", str(tmp_path / "out"), env=env)
    assert ok.returncode == 0, ok.stderr
    imported = tmp_path / "imported.yaml"
    imported.write_text("name: imp\nimports: [broken_checks]\nvalidators: [structure, bad.free]\n")
    ok = cli("replay", "--suite", str(imported), "--traces", str(recorded_home / "traces"),
             "--home", str(tmp_path / "out2"), "--fail-on", "never", env=env)
    assert ok.returncode == 0, ok.stderr
    unknown = cli("replay", "--suite", str(suite(tmp_path)), "--traces", str(recorded_home / "traces"),
                  "--home", str(tmp_path / "out3"), env=env)
    assert unknown.returncode == 2
    assert "entry point 'acme_checks' of group loopledger.validators failed to import" in unknown.stderr


def test_a_reply_to_a_run_whose_suite_cannot_be_loaded_here_leaves_it_waiting(tmp_path: Path) -> None:
    import json

    from loopledger.engine import Home

    site = install(tmp_path / "site", entry_point=False)
    (tmp_path / "acme.yaml").write_text(SUITE.format(imports="imports: [acme_checks]\n"))
    scenario = (Path(__file__).resolve().parents[2] / "datasets" / "scenarios" / "ask-user-answered.yaml").read_text()
    scenario = scenario.split("\nuser:")[0] + "\nsuite: acme.yaml\nexpect: {status: WAITING_USER}\n"
    (tmp_path / "waits.yaml").write_text(scenario.replace("id: ask-user-answered", "id: waits"))
    home = str(tmp_path / "home")
    ran = cli("run", str(tmp_path / "waits.yaml"), "--json", "--home", home, env={"PYTHONPATH": str(site)})
    assert ran.returncode == 0, ran.stderr
    line = json.loads(ran.stdout.strip().splitlines()[-1])
    assert line["status"] == "WAITING_USER"
    args = ["reply", line["run_id"], "--token", line["waiting"]["resume_token"], "--answer",
            '{"order_id": "ORD-1032"}', "--home", home]
    refused = cli(*args)  # acme_checks is not importable here
    assert refused.returncode == 1, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be driven here" in lines[0] and "acme_checks" in lines[0], refused.stderr
    store = Home.resolve(Path(home)).open_store()
    try:
        assert store.get_run(line["run_id"]).state.value == "WAITING_USER"
    finally:
        store.close()
    taken = cli(*args, env={"PYTHONPATH": str(site)})  # the same token, where the suite loads
    assert taken.returncode == 0, taken.stderr


def test_a_broken_plugin_does_not_hide_a_working_ones_validator(recorded_home: Path, tmp_path: Path) -> None:
    site = install(tmp_path / "site")  # acme_checks: registers acme.refund_limit
    (site / "broken_ep").mkdir()
    (site / "broken_ep" / "__init__.py").write_text("raise RuntimeError('boom')\n")
    info = site / "broken_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[loopledger.validators]\nbroken = broken_ep\n")
    out = cli("replay", "--suite", str(suite(tmp_path)), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--fail-on", "never", env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    assert acme_decisions(tmp_path / "out").get("ask", 0) > 0


def test_a_pinned_version_only_an_installed_plugin_registers_is_found(recorded_home: Path, tmp_path: Path) -> None:
    """Version 1 comes from the suite's imports, version 2 from an installed
    distribution: ``name@2`` imports the installed plugins to find it."""
    site = install(tmp_path / "site", module="acme_checks", entry_point=False)
    install(site, module="acme_two", body=PLUGIN.replace('version="1"', 'version="2"'))
    path = tmp_path / "pinned.yaml"
    path.write_text("name: pinned\nimports: [acme_checks]\nvalidators:\n  - structure\n"
                    "  - acme.refund_limit@2: {max_amount: 10.0}\n")
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"),
              "--home", str(tmp_path / "out"), "--fail-on", "never", env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    (replay,) = (tmp_path / "out" / "replays").iterdir()
    assert duckdb.sql(f"SELECT DISTINCT validator_version FROM '{replay}/decisions/*.parquet' "
                      "WHERE validator = 'acme.refund_limit'").fetchall() == [("2",)]


def test_a_new_version_of_a_built_in_is_used_unpinned_and_shown_as_a_version_change(recorded_home: Path,
                                                                                    tmp_path: Path) -> None:
    body = ("from loopledger.validators import Issue, Verdict, validator\n\n"
            "@validator(name='completion_gate', version='9')\ndef gate_v9():\n"
            "    return lambda inp: [Issue(Verdict.REJECT, 'v9_gate', 'version 9 rejects')]\n")
    site = install(tmp_path / "site", module="gate_two", body=body, entry_point=False)
    for name, member, versions in (("unpinned", "completion_gate", {"9"}), ("pinned", "completion_gate@3", {"3"})):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nimports: [gate_two]\nvalidators: [structure, {member}]\n")
        out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"),
                  "--home", str(tmp_path / name), "--fail-on", "never", env={"PYTHONPATH": str(site)})
        assert out.returncode == 0, out.stderr
        (replay,) = (tmp_path / name / "replays").iterdir()
        got = duckdb.sql(f"SELECT DISTINCT validator_version FROM '{replay}/decisions/*.parquet' "
                         "WHERE validator = 'completion_gate'").fetchall()
        assert {v for (v,) in got} == versions
        if name == "unpinned":
            assert "(versions 3→9)" in out.stdout, out.stdout
    # The bundled suites pin their members: registering version 9 leaves `default` as it is.
    import subprocess
    import sys

    bundled = subprocess.run(
        [sys.executable, "-c", "import gate_two\nfrom loopledger.validators import load_suite\n"
         "print(*(dict((m.name, m.version) for m in load_suite(s).members)['completion_gate']"
         " for s in ('default', 'strict')))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    assert bundled.stdout.split() == ["3", "3"], bundled.stderr


def test_a_script_without_a_main_guard_is_told_how_to_call_replay(recorded_home: Path, tmp_path: Path) -> None:
    """Spawned workers import the calling script again: without
    ``if __name__ == "__main__":`` each one fails while starting. The error
    says what to do, and the same script with the guard replays."""
    import subprocess
    import sys

    call = (f"from loopledger.replay import replay\n"
            f"r = replay({str(recorded_home / 'traces')!r}, 'default', write_to={str(tmp_path / 'replays')!r}, "
            f"workers=2)\nprint('flips', r.summary.flips)\n")
    bare, guarded = tmp_path / "bare.py", tmp_path / "guarded.py"
    bare.write_text(call)
    guarded.write_text("def main():\n" + "".join(f"    {line}\n" for line in call.splitlines())
                       + "\n\nif __name__ == '__main__':\n    main()\n")
    failed = subprocess.run([sys.executable, str(bare)], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert "WorkerLost" in last and 'call replay() under `if __name__ == "__main__":`' in last, last
    assert not [p for p in (tmp_path / "replays").iterdir() if not p.name.startswith(".")]
    ok = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "flips 0" in ok.stdout, ok.stderr


def test_a_broken_plugin_beside_a_working_one_hides_neither_its_names_nor_a_hint(home_copy: Path,
                                                                                 tmp_path: Path) -> None:
    """With one installed plugin failing to import, another's validators are
    still labelled by name, and a misspelt name is still answered with the
    closest known one, the broken plugin named beside it."""
    site = install(tmp_path / "site")
    install(site, module="broken_plugin", body="raise RuntimeError('boom')\n")
    env = {"PYTHONPATH": str(site)}
    run_id, step = duckdb.sql(f"SELECT run_id, step FROM '{home_copy}/traces/candidates/*.parquet' "
                              "WHERE items_json LIKE '%payments.refund%' ORDER BY run_id, step LIMIT 1").fetchone()
    out = cli("label", run_id, "--step", str(step), "--validator", "acme.refund_limit", "--expect", "ask",
              "--home", str(home_copy), env=env)
    assert out.returncode == 0, out.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: typo\nvalidators: [structure, acme.refund_limt]\n")
    refused = cli("replay", "--suite", str(typo), "--traces", str(home_copy / "traces"),
                  "--home", str(tmp_path / "out"), env=env)
    assert refused.returncode == 2
    line, = refused.stderr.strip().splitlines()
    assert "validators[1]: unknown validator 'acme.refund_limt' (did you mean 'acme.refund_limit'?)" in line, line
    assert "entry point 'broken_plugin' of group loopledger.validators failed to import: RuntimeError: boom" in line


def test_a_report_over_the_suites_own_code_is_refused(recorded_home: Path, tmp_path: Path) -> None:
    """A module a suite file imports, and the module of a ``module:attr``
    suite, are the suite as much as its YAML: a report never replaces them."""
    folder = tmp_path / "ci"
    folder.mkdir()
    beside = folder / "acme_beside.py"
    beside.write_text(PLUGIN + "\nSUITE = {'name': 'acme', 'validators': ['structure', "
                      "{'acme.refund_limit': {'max_amount': 10.0}}]}\n")
    path = folder / "acme.yaml"
    path.write_text(SUITE.format(imports="imports: [acme_beside]\n"))
    before = beside.read_text()
    for suite, option in ((str(path), "--markdown"), ("acme_beside:SUITE", "--junit")):
        out = cli("replay", "--suite", suite, "--traces", str(recorded_home / "traces"), "--home",
                  str(tmp_path / "out"), option, str(beside), cwd=folder)
        assert out.returncode == 2, (suite, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert f"is the suite's code {beside}" in out.stderr and option in out.stderr, out.stderr
        assert beside.read_text() == before
    assert not (tmp_path / "out" / "replays").exists()


def test_a_suites_imports_are_its_code_even_when_imported_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module the suite file lists, already imported by something else
    before the suite was loaded, is the suite's code all the same."""
    import importlib
    import sys

    from loopledger.replay._commands import _suite_code

    folder = tmp_path / "ci"
    folder.mkdir()
    module = folder / "acme_early.py"
    module.write_text(PLUGIN.replace("acme.refund_limit", "acme.early_limit"))
    path = folder / "acme.yaml"
    path.write_text(SUITE.format(imports="imports: [acme_early]\n").replace("acme.refund_limit", "acme.early_limit"))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "acme_early", raising=False)
    importlib.import_module("acme_early")  # before the suite is loaded
    assert module in [p.resolve() for p in _suite_code(str(path))]
