"""A user's own validators in a YAML suite: registered by an installed
distribution's entry point (group ``loopledger.validators``), or imported by
the suite's ``imports``. The distribution here is a real one to
``importlib.metadata``: a package and its ``.dist-info`` on PYTHONPATH."""

from __future__ import annotations

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
_member("code", code=7)
'''
#: member -> (the field that cannot be recorded, what is wrong with it)
ODD_MEMBERS = {"date": ("evidence", "is not plain JSON ($.t: date is not a JSON value)"),
               "set": ("evidence", "is not plain JSON ($.s: set is not a JSON value)"),
               "nan": ("evidence", "is not plain JSON ($.n: nan is not a JSON number)"),
               "surrogate": ("evidence", "is not plain JSON ($: string is not valid Unicode (surrogates not allowed))"),
               "verdict": ("verdict", "'maybe' is not one of accept, repair, ask, reject"),
               "code": ("code", "7 is not Unicode text")}


def test_a_decision_that_cannot_be_recorded_is_its_validators_error(recorded_home: Path, tmp_path: Path) -> None:
    """Like a member that raises (docs/validators.md): its decision becomes
    reject/validator_error naming the problem, and the replay goes on."""
    site = install(tmp_path / "site", module="odd_checks", body=UNRECORDABLE, entry_point=False)
    path = tmp_path / "odd.yaml"
    path.write_text("name: odd\nimports: [odd_checks]\nvalidators:\n  - structure\n"
                    + "".join(f"  - odd.{name}\n" for name in ODD_MEMBERS))
    out = cli("replay", "--suite", str(path), "--traces", str(recorded_home / "traces"), "--home",
              str(tmp_path / "out"), "--fail-on", "never", "--markdown", str(tmp_path / "r.md"),
              env={"PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr
    assert "Gate: pass" in out.stdout and (tmp_path / "r.md").is_file()
    (replay,) = (tmp_path / "out" / "replays").iterdir()
    rows = duckdb.sql(f"SELECT DISTINCT validator, verdict, code, message, evidence_json "
                      f"FROM '{replay}/decisions/*.parquet' WHERE validator LIKE 'odd.%'").fetchall()
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
