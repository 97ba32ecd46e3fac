"""Data directories sharing one journal (``--store``): each keeps its own
demo tool backends, so a run is driven only from the data directory whose
backend it acts on. Reconciled against another's backend, which never saw
its calls, a refund killed in flight would be sent a second time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from invariants import all_violations
from journal_kit import raw_connection

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]
SCENARIOS = Path(__file__).resolve().parents[2] / "datasets" / "scenarios"
REFUND = """\
id: shared-refund
contract:
  goal: Refund order ORD-1044 in full
  required_evidence: [refund_confirmed]
  allowed_tools: [payments.refund]
model:
  - tool_calls: [{name: payments.refund, arguments: {order_id: ORD-1044, amount: 25.0}}]
  - final: Refunded.
    claims: [{text: refund issued, evidence: [refund_confirmed]}]
"""
#: Both data directories sign tokens with one secret, so that a reply from
#: the other one passes the signature and meets the check under test.
SECRET = {"LOOPLEDGER_SECRET": "s" * 32}


def cli(*args: str, home: Path, store: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    merged.update(env or {})
    return subprocess.run([*CLI, *args, "--home", str(home), "--store", f"sqlite:{store}"], capture_output=True,
                          text=True, timeout=180, env=merged)


def executions(home: Path, tool: str) -> int:
    path = home / "demo_backend.sqlite"
    if not path.exists():
        return 0
    return sqlite3.connect(path).execute("SELECT COUNT(*) FROM executions WHERE tool = ?", (tool,)).fetchone()[0]


def one_line(proc: subprocess.CompletedProcess[str], *names: str) -> None:
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])


def test_a_refund_killed_in_flight_is_resumed_only_where_it_was_sent(tmp_path: Path) -> None:
    journal, a, b = tmp_path / "journal.sqlite", tmp_path / "a", tmp_path / "b"
    scenario = tmp_path / "refund.yaml"
    scenario.write_text(REFUND)
    killed = cli("run", str(scenario), home=a, store=journal, env={"LOOPLEDGER_CRASH_AT": "after_dispatch"})
    assert killed.returncode == -9, killed.stderr
    assert executions(a, "payments.refund") == 1
    (run_id,) = [r for (r,) in sqlite3.connect(journal).execute("SELECT run_id FROM runs")]

    elsewhere = cli("resume", "--json", home=b, store=journal)
    assert elsewhere.returncode == 3, (elsewhere.stdout, elsewhere.stderr)
    one_line(elsewhere, run_id, "was not resumed", "another data directory")
    (line,) = [json.loads(x) for x in elsewhere.stdout.splitlines()]
    assert line["run_id"] == run_id and line["status"] == "TOOL_RUNNING"
    assert executions(b, "payments.refund") == 0

    home = cli("resume", "--json", home=a, store=journal)
    assert home.returncode == 0, home.stderr
    (line,) = [json.loads(x) for x in home.stdout.splitlines()]
    assert (line["status"], line["reason"]) == ("SUCCEEDED", "completed")
    assert executions(a, "payments.refund") == 1 and executions(b, "payments.refund") == 0
    assert all_violations(a, f"sqlite:{journal}") == []


def test_a_reply_or_a_cancel_from_another_data_directory_is_left_to_the_runs_own(tmp_path: Path) -> None:
    journal, a, b = tmp_path / "journal.sqlite", tmp_path / "a", tmp_path / "b"
    started = cli("run", str(SCENARIOS / "approval-waits-for-person.yaml"), "--json", home=a, store=journal,
                  env=SECRET)
    assert started.returncode == 0, started.stderr
    (line,) = [json.loads(x) for x in started.stdout.splitlines()]
    run_id, token = line["run_id"], line["waiting"]["resume_token"]

    # Waiting for a person, with nothing due: a resume elsewhere leaves it
    # as it stands, and has nothing to report as left behind.
    passed = cli("resume", "--json", home=b, store=journal, env=SECRET)
    assert passed.returncode == 0, (passed.stdout, passed.stderr)
    (line,) = [json.loads(x) for x in passed.stdout.splitlines()]
    assert (line["run_id"], line["status"]) == (run_id, "WAITING_USER")

    refused = cli("reply", run_id, "--token", token, "--approve", "--json", home=b, store=journal, env=SECRET)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    one_line(refused, run_id, "cannot be driven here", "another data directory")
    # Nor may it issue a new token, which would void the one home a holds.
    reissued = cli("token", run_id, "--json", home=b, store=journal, env=SECRET)
    assert reissued.returncode == 1, (reissued.stdout, reissued.stderr)
    assert "cannot be driven here" in reissued.stderr and "another data directory" in reissued.stderr
    # With --json, each refusal is also the run's line, as every rejection is.
    for proc in (refused, reissued):
        (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
        assert (line["run_id"], line["status"]) == (run_id, "WAITING_USER")
        assert "another data directory" in line["rejected"]
    assert executions(b, "deploy.service") == 0

    requested = cli("cancel", run_id, home=b, store=journal, env=SECRET)
    assert requested.returncode == 0, requested.stderr
    assert "cancellation requested" in requested.stdout
    ended = cli("resume", "--json", home=a, store=journal, env=SECRET)
    assert ended.returncode == 0, ended.stderr
    (line,) = [json.loads(x) for x in ended.stdout.splitlines()]
    assert line["status"] == "CANCELLED"
    assert executions(a, "deploy.service") == executions(b, "deploy.service") == 0
    assert all_violations(a, f"sqlite:{journal}") == []


MAKER = """
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenarios

runner = Runner(Home(Path(sys.argv[1]), sys.argv[2] or None))
ids = [runner.create(s, "v1") for s in load_scenarios(sys.argv[3:])]
print(" ".join(ids), flush=True)
sys.stdin.read()  # holds its batch until the test lets go
"""


def test_a_resume_leaves_runs_a_live_run_command_has_not_started_to_it(tmp_path: Path, store_kind: str,
                                                                       journal_at: str | Path) -> None:
    """``run`` creates its whole batch before it drives it. A resume in
    another process meanwhile leaves the runs not started yet to their
    maker, which will deliver their scripted replies; once the maker is
    gone, the same resume takes them."""
    home = tmp_path / "home"
    url = str(journal_at) if store_kind == "postgresql" else ""
    on_store = ["--store", url] if url else []
    maker = subprocess.Popen([sys.executable, "-c", MAKER, str(home), url, str(SCENARIOS / "happy-refund.yaml"),
                              str(SCENARIOS / "approval-waits-for-person.yaml")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ids = maker.stdout.readline().split()
        assert len(ids) == 2
        merged = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
        resume = [*CLI, "resume", "--json", "--home", str(home), *on_store]
        alive = subprocess.run(resume, capture_output=True, text=True, timeout=120, env=merged)
        assert alive.returncode == 0, alive.stderr
        # Left to their maker, which reports them: no line here (not READY, a moment of them).
        assert alive.stdout == ""
        said = subprocess.run([x for x in resume if x != "--json"], capture_output=True, text=True, timeout=120,
                              env=merged)
        assert said.returncode == 0 and "2 run(s) left to another process driving them meanwhile." in said.stdout, \
            said.stdout
        conn = raw_connection(store_kind, url or home / "journal.sqlite")
        try:
            versions = [tuple(r) for r in conn.execute("SELECT state_version FROM runs").fetchall()]
        finally:
            conn.close()
        assert versions == [(1,), (1,)]
        refund = next(r for r in ids if r.startswith("happy-refund"))
        cancel = subprocess.run([*CLI, "cancel", refund, "--home", str(home), *on_store], capture_output=True,
                                text=True, timeout=120, env=merged)
        # A cancel is not left to the maker: the run had not started, it ends now.
        assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, (cancel.stdout, cancel.stderr)
    finally:
        maker.communicate("", timeout=60)
    gone = subprocess.run(resume, capture_output=True, text=True, timeout=120, env=merged)
    assert gone.returncode == 0, gone.stderr
    statuses = sorted(json.loads(x)["status"] for x in gone.stdout.splitlines())
    assert statuses == ["WAITING_USER"]


DRIVER = """
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from loopledger.engine._home import Home
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenarios

runner = Runner(Home(Path(sys.argv[1]), sys.argv[2]))
(run_id,) = runner.create_all([(s, "v1") for s in load_scenarios(sys.argv[3:])])
view = runner.controller.drive(run_id)  # to its wait for a person, and let go of it
print(run_id, view.state.value, flush=True)
sys.stdin.read()  # alive, holding its batch, until the test lets go
"""


def test_a_resume_from_another_data_directory_passes_over_runs_their_live_maker_drives(tmp_path: Path) -> None:
    """A scheduled resume on a shared journal meets the other directories'
    runs: those whose ``run`` process is alive are theirs, not failures of
    this resume. Once that process is gone, a run that waits for a person
    with nothing due is still passed over (exit 0): it only waits. (One that
    needs driving is named, exit 3: the refund test above.)"""
    journal, a, b = tmp_path / "journal.sqlite", tmp_path / "a", tmp_path / "b"
    maker = subprocess.Popen([sys.executable, "-c", DRIVER, str(a), f"sqlite:{journal}",
                              str(SCENARIOS / "approval-waits-for-person.yaml")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        run_id, state = maker.stdout.readline().split()
        assert state == "WAITING_USER"
        alive = cli("resume", "--json", home=b, store=journal)
        assert alive.returncode == 0, alive.stderr
        assert [(x["run_id"], x["status"]) for x in map(json.loads, alive.stdout.splitlines())] == [
            (run_id, "WAITING_USER")]
    finally:
        maker.communicate("", timeout=60)
    gone = cli("resume", "--json", home=b, store=journal)
    assert gone.returncode == 0, gone.stderr
    assert [(x["run_id"], x["status"]) for x in map(json.loads, gone.stdout.splitlines())] == [
        (run_id, "WAITING_USER")]
    # Due once the wait has run out: ending it EXPIRED is this directory's run's, named here.
    later = (datetime.now(timezone.utc) + timedelta(days=30)).isoformat()
    due = cli("resume", "--json", home=b, store=journal, env={"LOOPLEDGER_NOW": later})
    assert due.returncode == 3
    assert run_id in due.stderr and "another data directory" in due.stderr
