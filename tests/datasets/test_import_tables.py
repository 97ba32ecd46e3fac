"""Imported runs go straight to the trace tables: the rows must be exactly
those the journal and the recorder would have made, the publication must be
all or nothing, and the runs must stay visible to ``show``, exports and
compaction."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, table

from loopledger.datasets import ImportInputError, import_traces, read_conversations
from loopledger.datasets import _import_run
from loopledger.datasets._import_tables import TraceRows
from loopledger.datasets._import_writer import RunWriter
from loopledger.engine import Home, Recorder
from loopledger.engine._tables import TABLES

#: Columns that say when a row was made (or its journal number), not what it holds.
VOLATILE = {"ts", "started_at", "ended_at", "created_at", "label_id"}


#: Usage and price: an import leaves them null where its source does not give
#: them; the journal, whose columns are NOT NULL (a live run always knows its
#: usage), stores 0 there. Compared as the journal holds them.
USAGE = {"tokens_in", "tokens_out", "cost_usd"}


def _comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = [tuple(sorted((k, (0 if k in USAGE and v is None else v)) for k, v in r.items() if k not in VOLATILE))
           for r in rows]
    return sorted(out, key=repr)


def _arrow_rows(tables: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    return {name: _comparable(t.to_pylist()) for name, t in tables.items()}


def _traced(home: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {name: _comparable(table(home, name)) for name in TABLES}


def _chats(tmp: Path, n: int, name: str = "chats.jsonl") -> Path:
    """``n`` small conversations with tool calls, a failure, a user turn and a
    final answer; files of different names hold different conversations (a
    run is its record's content: the same record in two files is one run)."""
    lines = []
    for i in range(n):
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "get_order", "arguments": json.dumps({"order_id": f"A{i}"})}}
        messages = [
            {"role": "system", "content": "policy"},
            {"role": "user", "content": f"where is order A{i}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "Error: not found" if i % 3 == 0 else '{"ok": 1}'},
            {"role": "assistant", "content": "Which order did you mean?"},
            {"role": "user", "content": "the other one"},
            {"role": "assistant", "content": f"Order A{i} is on its way."},
        ]
        lines.append(json.dumps({"messages": messages, "metadata": {"id": f"{name}:r{i}", "reward": i % 2}}))
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _through_the_journal(fmt: str, paths: list[Path], home: Path) -> None:
    where = Home.resolve(home)
    store = where.open_store()
    try:
        with store.batch():
            for _, conversations in read_conversations(fmt, paths):
                for conv in conversations:
                    RunWriter(store, conv).write()
        Recorder(store, where.traces).export()
    finally:
        store.close()


def _direct(fmt: str, paths: list[Path]) -> dict[str, Any]:
    rows = TraceRows()
    for _, conversations in read_conversations(fmt, paths):
        for conv in conversations:
            RunWriter(rows, conv).write()
    return rows.tables()


def test_rows_are_what_the_journal_and_its_export_hold(tmp_path: Path) -> None:
    path = _chats(tmp_path, 12)
    _through_the_journal("openai-jsonl", [path], tmp_path / "journal")
    expected = _traced(tmp_path / "journal")
    got = _arrow_rows(_direct("openai-jsonl", [path]))
    assert sum(len(rows) for rows in expected.values()) > 100
    for name in TABLES:
        assert got[name] == expected[name], name


def test_rows_are_what_the_journal_holds_on_real_traces(external: Path, tau2_files: list[Path],
                                                        tmp_path: Path) -> None:
    """Every path of the writer (waits, user tool calls, tails, failures) on real transcripts."""
    for fmt, paths in (("tau-bench", [external / "tau-bench" / "trajectories" / "gpt-4o-airline.json"]),
                       ("tau2", tau2_files[:2])):
        home = tmp_path / fmt
        _through_the_journal(fmt, paths, home)
        expected = _traced(home)
        got = _arrow_rows(_direct(fmt, paths))
        assert len(expected["runs"]) >= 10
        for name in TABLES:
            assert got[name] == expected[name], (fmt, name)


def _in_parallel(monkeypatch: pytest.MonkeyPatch, processes: int) -> None:
    monkeypatch.setattr(_import_run, "PARALLEL_FROM_BYTES", 1)
    monkeypatch.setattr(os, "cpu_count", lambda: processes)


@pytest.mark.parametrize("processes", [2, 3])
def test_parallel_writing_gives_the_same_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 processes: int) -> None:
    """Files cut between processes (each side writes its part of their runs)."""
    paths = [_chats(tmp_path, 9, "a.jsonl"), _chats(tmp_path, 7, "b.jsonl"), _chats(tmp_path, 5, "c.jsonl")]
    import_traces("openai-jsonl", paths, home=tmp_path / "one")
    _in_parallel(monkeypatch, processes)
    result = import_traces("openai-jsonl", paths, home=tmp_path / "two")
    assert result.runs == 21 and [(f.runs, f.skipped) for f in result.files] == [(9, 0), (7, 0), (5, 0)]
    assert _traced(tmp_path / "two") == _traced(tmp_path / "one")


def test_a_run_repeated_across_processes_is_imported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _chats(tmp_path, 6)
    _in_parallel(monkeypatch, 2)
    result = import_traces("openai-jsonl", [path, path], home=tmp_path / "home")
    assert [(f.runs, f.skipped) for f in result.files] == [(6, 0), (0, 6)]
    assert len(table(tmp_path / "home", "runs")) == 6


def test_a_bad_file_read_by_a_worker_process_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _chats(tmp_path, 6, "a.jsonl")
    bad = tmp_path / "b.jsonl"
    bad.write_text(good.read_text() + '{"messages": [{"role": "robot", "content": "beep"}]}\n')
    _in_parallel(monkeypatch, 2)
    with pytest.raises(ImportInputError, match="robot") as caught:
        import_traces("openai-jsonl", [good, bad], home=tmp_path / "home")
    assert caught.value.file == str(bad) and caught.value.record and "line 7" in caught.value.record
    assert table(tmp_path / "home", "runs") == []


def test_a_share_converts_and_checks_only_its_part_of_a_cut_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A file cut between processes: each converts its part of the runs, and
    a bad record is found by the process whose part holds it."""
    from loopledger.datasets._import_run import _Job, _sources, _write_pieces

    path = tmp_path / "chats.jsonl"
    good = _chats(tmp_path, 7, "good.jsonl").read_text()
    path.write_text('{"messages": [{"role": "robot", "content": "beep"}]}\n' + good)  # 8 runs, the first bad
    job = _Job(_sources("openai-jsonl", [path], None), None, set(), set())
    counts, totals, written = _write_pieces(job, [(0, 0.5, 1.0)], TraceRows())
    assert totals == {0: 8} and counts[0]["runs"] == 4 and len(written) == 4
    with pytest.raises(ImportInputError, match="robot"):
        _write_pieces(job, [(0, 0.0, 0.5)], TraceRows())
    _in_parallel(monkeypatch, 2)
    with pytest.raises(ImportInputError, match="robot") as caught:
        import_traces("openai-jsonl", [path], home=tmp_path / "home")
    assert caught.value.record and "line 1" in caught.value.record


def test_shares_are_weighed_by_the_bytes_of_json_a_file_holds(tmp_path: Path) -> None:
    import gzip

    from loopledger.datasets._import_run import _cut, _json_bytes

    text = _chats(tmp_path, 40).read_bytes()
    packed = tmp_path / "chats.json.gz"
    packed.write_bytes(gzip.compress(text))
    plain = tmp_path / "plain.json"
    plain.write_bytes(text)
    assert _json_bytes(packed, packed.stat().st_size) == len(text) > 4 * packed.stat().st_size
    assert _json_bytes(plain, len(text)) == len(text)
    # A small gzip file and a large plain one of the same JSON weigh the same: the cut is between them.
    assert _cut([_json_bytes(packed, packed.stat().st_size), len(text)], 2) == [[(0, 0.0, 1.0)], [(1, 0.0, 1.0)]]


def test_an_import_cut_before_its_manifest_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopledger.engine import _recorder

    home = tmp_path / "home"
    path = _chats(tmp_path, 4)

    def cut(*args: Any) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(_recorder, "_durable_replace", cut)
    with pytest.raises(OSError, match="power cut"):
        import_traces("openai-jsonl", [path], home=home)
    assert list((home / "traces").rglob("*.tmp"))  # what it had written, unpublished
    monkeypatch.undo()
    where = Home.resolve(home)
    store = where.open_store()
    try:
        Recorder(store, where.traces).export()
    finally:
        store.close()
    assert not list((home / "traces").rglob("*.tmp"))
    assert table(home, "runs") == [] and table(home, "events") == []
    assert import_traces("openai-jsonl", [path], home=home).runs == 4


def test_an_import_cut_after_its_manifest_is_finished_by_the_next(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from loopledger.engine import _recorder

    home = tmp_path / "home"
    path = _chats(tmp_path, 4)
    renames = {"n": 0}
    real_replace = os.replace

    def cut_after_two(src: Any, dst: Any) -> None:
        if str(dst).endswith(".parquet"):
            renames["n"] += 1
            if renames["n"] > 2:
                raise OSError("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(_recorder.os, "replace", cut_after_two)
    with pytest.raises(OSError, match="power cut"):
        import_traces("openai-jsonl", [path], home=home)
    monkeypatch.undo()
    # Half published: the first two tables (by name: artifacts, candidates) are in place, the runs are not.
    assert table(home, "artifacts") and table(home, "candidates") and table(home, "runs") == []
    again = import_traces("openai-jsonl", [path], home=home)
    assert again.runs == 0 and again.skipped == 4  # the cut import was finished first
    expected = _arrow_rows(_direct("openai-jsonl", [path]))
    assert _traced(home) == expected


def test_exports_and_compaction_keep_imported_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    import_traces("openai-jsonl", [_chats(tmp_path, 5, "a.jsonl")], home=home)
    import_traces("openai-jsonl", [_chats(tmp_path, 3, "b.jsonl")], home=home)
    before = _traced(home)
    where = Home.resolve(home)
    store = where.open_store()
    try:
        recorder = Recorder(store, where.traces)
        recorder.export()
        merged = recorder.compact()
    finally:
        store.close()
    assert merged["events"] == 2  # the two imports' segments became one file
    assert _traced(home) == before
    assert len(table(home, "runs")) == 8


def test_show_prints_an_imported_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    import_traces("openai-jsonl", [_chats(tmp_path, 2)], home=home)
    run_id = table(home, "runs")[0]["run_id"]
    shown = cli("show", run_id, "--home", str(home))
    assert shown.returncode == 0, shown.stderr
    assert run_id in shown.stdout and "SUCCEEDED" in shown.stdout and "get_order" in shown.stdout
    as_json = cli("show", run_id, "--json", "--home", str(home))
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["status"] == "SUCCEEDED" and document["events"][0]["seq"] == 1
    assert any(op["tool"] == "get_order" for op in document["operations"])
    missing = cli("show", "no-such-run", "--home", str(home))
    assert missing.returncode == 1 and "no-such-run" in missing.stderr



def test_usage_a_source_does_not_give_is_unknown_not_zero(tmp_path: Path) -> None:
    """tau-bench, ToolBench and many OpenAI exports carry no usage: their runs
    and candidates hold null tokens and cost (summed and averaged over as
    unknown), not a 0 that reads as a free run; what a source gives is kept,
    and a run whose messages give some of it sums what they give."""
    plain = _chats(tmp_path, 1, "plain.jsonl")
    record = json.loads(_chats(tmp_path, 1, "priced.jsonl").read_text())
    record["metadata"]["id"] = "priced"
    record["messages"][2].update(usage={"prompt_tokens": 120, "completion_tokens": 7}, cost=0.0015)
    record["messages"][4].update(usage={"prompt_tokens": 150})  # no completion count, no cost
    (tmp_path / "priced.jsonl").write_text(json.dumps(record) + "\n")
    home = tmp_path / "home"
    import_traces("openai-jsonl", [plain, tmp_path / "priced.jsonl"], home=home)
    runs = {r["task_id"] or r["run_id"]: r for r in table(home, "runs")}
    usage = {(r["tokens_in"], r["tokens_out"], r["cost_usd"]) for r in runs.values()}
    assert usage == {(None, None, None), (270, 7, 0.0015)}
    candidates = sorted(((c["tokens_in"], c["tokens_out"], c["cost_usd"]) for c in table(home, "candidates")),
                        key=repr)
    assert candidates.count((None, None, None)) == 3 + 1  # the plain run's three, the priced run's last
    assert (120, 7, 0.0015) in candidates and (150, None, None) in candidates
    unpriced = next(r["run_id"] for r in runs.values() if r["tokens_in"] is None)
    shown = cli("show", unpriced, "--json", "--home", str(home))
    assert shown.returncode == 0, shown.stderr
    assert {k: json.loads(shown.stdout)[k] for k in USAGE} == dict.fromkeys(USAGE)
    text = cli("show", unpriced, "--home", str(home))
    assert "tokens -  cost -" in text.stdout, text.stdout


def _stat(pid: int) -> list[str] | None:
    """A process's /proc fields after its name (state first), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if (fields := _stat(int(p.name))) is not None and int(fields[1]) == pid and fields[0] != "Z"]


@pytest.mark.skipif(os.cpu_count() == 1 or not Path("/proc/self/stat").exists(),
                    reason="the import splits into processes on several cores (Linux /proc to see them)")
def test_a_killed_imports_share_processes_end_with_it_and_leave_the_home_usable(tmp_path: Path) -> None:
    import signal
    import subprocess
    import time

    from import_kit import LOOPLEDGER

    big = _chats(tmp_path, 6000, "big.jsonl")
    assert big.stat().st_size > _import_run.PARALLEL_FROM_BYTES
    home = tmp_path / "home"
    scratch = tmp_path / "tmp"  # the import's temporary folder (TMPDIR), to see what it leaves there
    scratch.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "LOOPLEDGER_HOME"}, "TMPDIR": str(scratch)}
    importer = subprocess.Popen([LOOPLEDGER, "import", "openai-jsonl", str(big), "--home", str(home)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while not (shares := _children(importer.pid)) and importer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if not shares:
        importer.wait(timeout=120)
        pytest.skip("the import finished before its share processes could be seen")
    importer.send_signal(signal.SIGKILL)
    importer.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(map(_running, shares)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_running, shares))
    # The killed import's scratch folder is left behind...
    assert [p.name for p in scratch.iterdir()] and all(
        p.name.startswith("loopledger-import-") for p in scratch.iterdir())
    # ... the traces' lock is free: another import of the home finishes, and removes it.
    again = subprocess.run([LOOPLEDGER, "import", "openai-jsonl", str(_chats(tmp_path, 3)), "--home", str(home)],
                           capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert list(scratch.iterdir()) == []


def test_an_import_sweeps_scratch_folders_whose_import_is_gone(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def folder(name: str) -> Path:
        made = scratch / f"loopledger-import-{name}"
        (made / "0").mkdir(parents=True)
        (made / "0" / "runs").write_bytes(b"arrow")
        (made / ".owner.lock").touch()
        return made

    folder("gone")  # its import ended: nobody holds its lock
    live = folder("live")  # an import under way, in another process: it holds the lock
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
                               str(live / ".owner.lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    making = scratch / "loopledger-import-making"  # just made, its lock file not yet: left alone
    making.mkdir()
    try:
        import_traces("openai-jsonl", [_chats(tmp_path, 2)], home=tmp_path / "home")
        assert sorted(p.name for p in scratch.iterdir()) == sorted([live.name, making.name])
        # A large import's own folder goes when it is done.
        _in_parallel(monkeypatch, 2)
        import_traces("openai-jsonl", [_chats(tmp_path, 20, "more.jsonl")], home=tmp_path / "home")
        assert sorted(p.name for p in scratch.iterdir()) == sorted([live.name, making.name])
    finally:
        holder.communicate("", timeout=30)
    # Its import gone, the next one removes it.
    import_traces("openai-jsonl", [_chats(tmp_path, 3, "last.jsonl")], home=tmp_path / "home")
    assert [p.name for p in scratch.iterdir()] == [making.name]


@pytest.mark.parametrize("broken", ["not parquet", "no run_id column"])
def test_a_broken_trace_file_already_in_the_home_is_bad_input_and_nothing_is_imported(tmp_path: Path,
                                                                                      broken: str) -> None:
    """What is there is read to skip runs already imported: a file that cannot
    be read so is named, exit 2, as replay names it (it was a traceback)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path / "home"
    assert cli("import", "openai-jsonl", str(_chats(tmp_path, 2, "first.jsonl")), "--home", str(home)).returncode == 0
    bad = home / "traces" / "runs" / "zz.parquet"
    if broken == "not parquet":
        bad.write_bytes(b"garbage\n")
    else:
        pq.write_table(pa.table({"x": [1]}), bad)
    before = sorted(p.name for p in (home / "traces").rglob("*"))
    done = cli("import", "openai-jsonl", str(_chats(tmp_path, 3, "second.jsonl")), "--home", str(home))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"loopledger: bad input: {bad}: not a readable runs table file with a run_id column")
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert sorted(p.name for p in (home / "traces").rglob("*")) == before


def test_a_reader_that_goes_away_after_the_import_does_not_make_it_a_failure(tmp_path: Path) -> None:
    """``loopledger import ... | head -1``: the runs are imported; the report
    that can no longer be read is not an I/O failure (it was exit 3)."""
    import subprocess

    from import_kit import LOOPLEDGER

    home = tmp_path / "home"
    proc = subprocess.Popen([LOOPLEDGER, "import", "openai-jsonl", str(_chats(tmp_path, 4)), "--home", str(home)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes a line: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == "" and len(table(home, "runs")) == 4


def test_usage_under_the_responses_api_names_is_read(tmp_path: Path) -> None:
    """``input_tokens``/``output_tokens`` (the Responses API's and Anthropic's
    names) count where the Chat Completions names are absent, and are
    checked the same way, named as written."""
    record = json.loads(_chats(tmp_path, 1, "chats.jsonl").read_text())
    record["messages"][2].update(usage={"input_tokens": 90, "output_tokens": 4})
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(record) + "\n")
    import_traces("openai-jsonl", [path], home=tmp_path / "home")
    (run,) = table(tmp_path / "home", "runs")
    assert (run["tokens_in"], run["tokens_out"]) == (90, 4)
    record["messages"][2].update(usage={"input_tokens": 90, "output_tokens": -1})
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ImportInputError, match=r"messages\[2\]\.usage\.output_tokens"):
        import_traces("openai-jsonl", [path], home=tmp_path / "other")
