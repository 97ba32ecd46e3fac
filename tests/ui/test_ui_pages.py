"""Every page of the workbench through Streamlit's AppTest, on the recorded
bundled scenarios: the figures shown are the data's (computed here with
DuckDB over the raw files), interactions work, bad data is a message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from loopledger.ui._data import TERMINAL_STATES
from ui_kit import REPO, SYNTHETIC_REPLAY, scalar, table

APP = str(REPO / "ui" / "app.py")


def open_app(home: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None,
             **query: str) -> AppTest:
    monkeypatch.setenv("LOOPLEDGER_HOME", str(home))
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def frame_with(at: AppTest, *columns: str):
    """The first data grid on the page that has these columns."""
    for grid in at.dataframe:
        if set(columns) <= set(grid.value.columns):
            return grid.value
    raise AssertionError(f"no grid with columns {columns}")


def shown_total(at: AppTest) -> int:
    """The "Showing a–b of N" line of a pager."""
    for md in at.markdown:
        found = re.search(r"of \*\*([\d,]+)\*\*", md.value)
        if found:
            return int(found.group(1).replace(",", ""))
    raise AssertionError("no pager line on the page")


def imported_home(tmp_path: Path, lines: list[str]) -> Path:
    """A data directory holding ``lines`` (openai-jsonl records) imported by the command line."""
    import subprocess
    import sys

    (tmp_path / "chats.jsonl").write_text("\n".join(lines) + "\n")
    home = tmp_path / "home"
    done = subprocess.run([str(Path(sys.executable).with_name("loopledger")), "import", "openai-jsonl",
                           str(tmp_path / "chats.jsonl"), "--home", str(home)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return home


def test_overview(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env)
    runs = table(recorded_home, "runs")
    total = scalar(f"SELECT count(*) FROM {runs}")
    finished = scalar(f"SELECT count(*) FROM {runs} WHERE status IN {TERMINAL_STATES}")
    ok = scalar(f"SELECT count(*) FROM {runs} WHERE status = 'SUCCEEDED'")
    tokens = scalar(f"SELECT sum(tokens_in + tokens_out) FROM {runs}")
    shown = metrics(at)
    assert shown["Runs"] == f"{total:,}"
    assert shown["Success rate"] == f"{100 * ok / finished:.1f}%"
    assert shown["Tokens"] == f"{tokens:,}"
    assert float(shown["Waiting (s)"].replace(",", "")) > 0
    assert not at.error


def test_runs_filter_and_open(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_runs.py")
    runs = table(recorded_home, "runs")
    assert shown_total(at) == scalar(f"SELECT count(*) FROM {runs}")
    at.multiselect(key="runs_status").set_value(["FAILED"]).run()
    at.multiselect(key="runs_version").set_value(["v2"]).run()
    failed_v2 = scalar(f"SELECT count(*) FROM {runs} WHERE status = 'FAILED' AND prompt_version = 'v2'")
    assert shown_total(at) == failed_v2
    grid = frame_with(at, "run_id", "status", "tokens")
    assert set(grid["status"]) == {"FAILED"} and len(grid) == min(failed_v2, 50)
    at.text_input(key="runs_task").input("loop-oscillation").run()
    assert shown_total(at) == 1
    picked = at.selectbox(key="runs_pick").value
    assert picked.startswith("loop-oscillation.v2.")
    at.button(key="runs_open").click().run()
    assert not at.exception
    assert at.query_params["run_id"] == [picked] or at.query_params["run_id"] == picked


def test_a_new_filter_starts_again_at_the_first_page(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_runs.py")
    at.selectbox(key="runs_size").set_value(25).run()
    at.number_input(key="runs_page").set_value(3).run()
    assert at.markdown and any("Showing **51–" in m.value for m in at.markdown)
    at.multiselect(key="runs_version").set_value(["v2"]).run()
    assert at.number_input(key="runs_page").value == 1
    assert any("Showing **1–25**" in m.value for m in at.markdown)


def test_runs_recorded_after_the_page_was_opened_are_listed(writable_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    """The date range a first view offered (the runs' own span) was kept as
    a filter: runs started on a later day were hidden until the page was
    opened anew. A range left whole follows the runs; a narrowed one filters."""
    import os
    import subprocess
    import sys

    at = open_app(writable_home, ui_env, "_pages_runs.py")
    before = shown_total(at)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    later = subprocess.run([str(Path(sys.executable).with_name("loopledger")), "run",
                            str(REPO / "datasets" / "scenarios" / "happy-read-file.yaml"), "--home", str(writable_home)],
                           capture_output=True, text=True, timeout=300,
                           env={**env, "LOOPLEDGER_NOW": "2031-06-01T10:00:00+00:00"})
    assert later.returncode == 0, later.stderr
    at.run()
    assert shown_total(at) == before + 1
    lo, _ = at.date_input(key="runs_dates").value
    at.date_input(key="runs_dates").set_value((lo, __import__("datetime").date(2031, 5, 31))).run()
    assert shown_total(at) == before  # narrowed: the later run is filtered out


def test_run_deep_link_shows_the_run(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'loop_diagnoses')} ORDER BY run_id LIMIT 1")
    at = open_app(recorded_home, ui_env, run_id=run_id)
    row = __import__("duckdb").sql(f"SELECT status, reason, steps, tool_calls FROM {table(recorded_home, 'runs')} "
                                   f"WHERE run_id = '{run_id}'").fetchone()
    shown = metrics(at)
    assert (shown["Status"], shown["Reason"], shown["Steps"], shown["Tool calls"]) == (
        row[0], row[1], str(row[2]), str(row[3]))
    # The run's closed spans split into queued (creation until an engine took it up), processing, waiting.
    moves = __import__("duckdb").sql(
        f"SELECT epoch_us(ts) FROM {table(recorded_home, 'events')} WHERE run_id = '{run_id}'"
        " AND to_state IS NOT NULL ORDER BY seq").fetchall()
    queued, whole = (moves[1][0] - moves[0][0]) / 1e6, (moves[-1][0] - moves[0][0]) / 1e6
    assert shown["Queued (s)"] == f"{queued:.3f}"
    split = sum(float(shown[k]) for k in ("Queued (s)", "Processing (s)", "Waiting (s)"))
    assert split == pytest.approx(whole, abs=0.002)
    assert [t.label for t in at.tabs][:5] == ["Candidates", "Decisions", "Operations", "Waits & replies",
                                              "Loop diagnosis"]
    decisions = frame_with(at, "validator_version", "verdict")
    assert len(decisions) == scalar(f"SELECT count(*) FROM {table(recorded_home, 'validations')} "
                                    f"WHERE run_id = '{run_id}'")
    assert any(run_id in s.value for s in at.subheader)


def test_a_run_in_a_wait_says_its_wait_is_not_counted_yet(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'runs')} WHERE status = 'WAITING_USER' "
                    "ORDER BY run_id LIMIT 1")
    at = open_app(recorded_home, ui_env, run_id=run_id)
    (waiting,) = [m for m in at.metric if m.label == "Waiting (s)"]
    assert waiting.help == "finished waits; the wait this run is in now is counted once it ends"
    ended = scalar(f"SELECT run_id FROM {table(recorded_home, 'runs')} WHERE status = 'SUCCEEDED' LIMIT 1")
    at = open_app(recorded_home, ui_env, run_id=ended)
    (waiting,) = [m for m in at.metric if m.label == "Waiting (s)"]
    assert not waiting.help


def test_run_page_for_an_unknown_run(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, run_id="no-such-run")
    assert any("No run `no-such-run`" in w.value for w in at.warning)


def test_labelling_a_decision_from_the_run_page(writable_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    run_id = scalar(f"SELECT run_id FROM {table(writable_home, 'validations')} WHERE verdict = 'reject' "
                    "ORDER BY run_id LIMIT 1")
    at = open_app(writable_home, ui_env, run_id=run_id)
    form = f"label_form:{run_id}:0"
    at.selectbox(key=f"{form}:pick").set_value(1)
    at.radio(key=f"{form}:verdict").set_value("accept")
    at.text_input(key=f"{form}:note").input("the gate was too strict")
    at.button(key=f"FormSubmitter:{form}-Save label").click().run()
    assert not at.exception and not at.error
    assert any("Saved label" in s.value for s in at.success)
    # The run's labels, above the form, list it at once.
    assert "the gate was too strict" in list(frame_with(at, "expected_verdict", "note")["note"])
    stored = __import__("duckdb").sql(
        f"SELECT run_id, expected_verdict, source, note FROM {table(writable_home, 'labels')} "
        "WHERE source = 'human'").fetchall()
    assert stored == [(run_id, "accept", "human", "the gate was too strict")]
    at.switch_page("_pages_labels.py").run()
    assert metrics(at)["Human"] == "1"


def test_a_label_is_saved_only_once_a_person_chose_its_decision_and_verdict(
        writable_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    """The form starts empty: Save with nothing chosen (or only the verdict)
    writes nothing and says what is missing. (It started on the first
    decision and accept, so an Enter in the note, or a second click after a
    save, wrote a label nobody chose.)"""
    run_id = scalar(f"SELECT run_id FROM {table(writable_home, 'validations')} ORDER BY run_id LIMIT 1")
    at = open_app(writable_home, ui_env, run_id=run_id)
    form = f"label_form:{run_id}:0"
    assert at.selectbox(key=f"{form}:pick").value is None and at.radio(key=f"{form}:verdict").value is None
    at.button(key=f"FormSubmitter:{form}-Save label").click().run()
    assert any("Pick the decision and the expected verdict first; nothing was saved." in w.value for w in at.warning)
    at.radio(key=f"{form}:verdict").set_value("reject")
    at.button(key=f"FormSubmitter:{form}-Save label").click().run()
    assert any("Pick the decision first; nothing was saved." in w.value for w in at.warning)
    assert not at.exception and not any("Saved label" in s.value for s in at.success)
    assert __import__("sqlite3").connect(writable_home / "journal.sqlite").execute(
        "SELECT count(*) FROM labels WHERE source = 'human'").fetchone() == (0,)


def test_the_label_form_belongs_to_its_run_and_a_second_save_writes_nothing(
        writable_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    """A decision picked on one run's page was still picked on the next
    run's (an index into another list of decisions), and saved there; a
    second click on Save sent the cleared form (accept, no note)."""
    from loopledger.ui._labels import add_human_label

    first, second = [r for (r,) in __import__("duckdb").sql(
        f"SELECT DISTINCT run_id FROM {table(writable_home, 'validations')} ORDER BY run_id LIMIT 2").fetchall()]
    at = open_app(writable_home, ui_env, run_id=first)
    at.selectbox(key=f"label_form:{first}:0:pick").set_value(3)
    at.text_input[0].input(f" {second} ").run()  # the page's Run id box; a pasted id's spaces are dropped
    assert not at.exception and any(second in s.value for s in at.subheader)
    assert at.selectbox(key=f"label_form:{second}:0:pick").value is None  # nothing carried over
    with pytest.raises(KeyError):
        at.selectbox(key=f"label_form:{first}:0:pick")
    # The same label twice (a double click) is one label.
    args = {"run_id": second, "step": 1, "attempt": 1, "candidate_id": "c", "validator": "", "note": "n",
            "expected_verdict": "repair"}
    assert add_human_label(writable_home, **args) == add_human_label(writable_home, **args)
    assert __import__("sqlite3").connect(writable_home / "journal.sqlite").execute(
        "SELECT count(*) FROM labels WHERE run_id = ?", (second,)).fetchone() == (1,)


def test_a_label_on_traces_another_journal_exported_is_refused_before_it_is_written(
        recorded_home: Path, tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    """Traces copied from elsewhere beside a journal of their own: the
    label could never be exported to them, so nothing is written."""
    import shutil
    import sqlite3

    from loopledger.engine import Home

    home = tmp_path / "home"
    shutil.copytree(recorded_home / "traces", home / "traces")
    Home(home).open_store().close()  # this home's own, empty journal
    run_id = scalar(f"SELECT run_id FROM {table(home, 'validations')} ORDER BY run_id LIMIT 1")
    at = open_app(home, ui_env, run_id=run_id)
    at.selectbox(key=f"label_form:{run_id}:0:pick").set_value(0)
    at.radio(key=f"label_form:{run_id}:0:verdict").set_value("accept")
    at.button(key=f"FormSubmitter:label_form:{run_id}:0-Save label").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any("these traces were exported from another journal" in e for e in errors), errors
    assert sqlite3.connect(home / "journal.sqlite").execute("SELECT count(*) FROM labels").fetchone() == (0,)


def test_loop_diagnoses(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_diagnoses.py")
    diag = table(recorded_home, "loop_diagnoses")
    shown = metrics(at)
    assert shown["Findings"] == f"{scalar(f'SELECT count(*) FROM {diag}'):,}"
    assert shown["Runs with a finding"] == f"{scalar(f'SELECT count(DISTINCT run_id) FROM {diag}'):,}"
    at.selectbox(key="diag_detector").set_value("loop.no_progress").run()
    assert shown_total(at) == scalar(f"SELECT count(*) FROM {diag} WHERE detector = 'loop.no_progress'")
    assert set(frame_with(at, "evidence_json", "detector", "status")["detector"]) == {"loop.no_progress"}


def test_loop_diagnoses_of_a_replay(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_diagnoses.py")
    at.selectbox(key="diag_detector").set_value("loop.no_progress").run()
    shown_sources = at.selectbox(key="diag_source").options
    # A replay is named with the suite it ran.
    assert shown_sources[0] == "recorded" and len(shown_sources) == 2, shown_sources
    replay_id, suite = shown_sources[1].split(" · suite ")
    assert suite == scalar(f"SELECT suite_name FROM read_parquet('{recorded_home}/replays/{replay_id}/summary/*.parquet')")
    sources = ["recorded", replay_id]
    at.selectbox(key="diag_source").set_value(sources[1]).run()
    found = f"read_parquet('{recorded_home}/replays/{sources[1]}/loop_diagnoses/**/*.parquet')"
    shown = metrics(at)
    assert shown["Findings"] == f"{scalar(f'SELECT count(*) FROM {found}'):,}"
    assert shown["Runs with a finding"] == f"{scalar(f'SELECT count(DISTINCT run_id) FROM {found}'):,}"
    # The detector chosen before still filters, when the replay has findings of it.
    assert shown_total(at) == scalar(f"SELECT count(*) FROM {found} WHERE detector = 'loop.no_progress'")
    at.selectbox(key="diag_detector").set_value("loop.repeated_call").run()
    assert shown_total(at) == scalar(f"SELECT count(*) FROM {found} WHERE detector = 'loop.repeated_call'") > 0
    assert not at.exception and not at.error


def test_compare_validators_and_swap(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_validators.py")
    flips = scalar(f"SELECT count(*) FROM {table(recorded_home, 'validations')} WHERE validator = "
                   "'completion_gate' AND verdict = 'accept' AND run_id LIKE '%.v2.%'")
    at.selectbox(key="cmp_a").set_value("recorded")
    at.selectbox(key="cmp_b").set_value(SYNTHETIC_REPLAY).run()
    assert f"{SYNTHETIC_REPLAY} · suite synthetic" in at.selectbox(key="cmp_b").options  # which suite it ran
    assert metrics(at)["Flips"] == f"{flips:,}"
    confusion = at.table[0].value
    assert int(confusion.loc["accept", "reject"]) == flips
    at.button(key="cmp_swap").click().run()
    assert at.selectbox(key="cmp_a").value == SYNTHETIC_REPLAY
    assert int(at.table[0].value.loc["reject", "accept"]) == flips
    assert metrics(at)["Flips"] == f"{flips:,}"
    # Named by side, not by which one is a replay: A is the replay now.
    by = frame_with(at, "A_verdict", "B_verdict")
    assert set(zip(by["A_verdict"], by["B_verdict"])) == {("reject", "accept")}
    assert not any(c.startswith(("baseline_", "replay_")) for c in by.columns)
    assert at.table[0].value.index.name == "A"


def test_compare_prompt_versions(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_prompts.py")
    runs = table(recorded_home, "runs")
    shown = at.table[0].value
    for version in ("v1", "v2"):
        k = scalar(f"SELECT count(*) FROM {runs} WHERE prompt_version = '{version}' AND status = 'SUCCEEDED'")
        n = scalar(f"SELECT count(*) FROM {runs} WHERE prompt_version = '{version}' AND status IN "
                   f"{TERMINAL_STATES}")
        cell = shown.loc["Success rate", version]
        assert cell.startswith(f"{100 * k / n:.1f}%") and cell.endswith(f"({k}/{n})")
        total = scalar(f"SELECT count(*) FROM {runs} WHERE prompt_version = '{version}'")
        assert shown.loc["Runs", version] == f"{total:,}"


def test_each_prompt_version_has_one_colour_in_every_chart(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    """Version A first, whatever order the data comes in: with B = v1 and
    A = v2, v1 was A's colour in two charts of three."""
    import json

    from loopledger.ui._pages_prompts import SIDE_COLOURS

    at = open_app(recorded_home, ui_env, "_pages_prompts.py")
    at.selectbox(key="pv_a").set_value("v2").run()
    at.selectbox(key="pv_b").set_value("v1").run()
    charts = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    assert len(charts) == 3
    for chart in charts:
        colours = {trace["name"]: trace["marker"]["color"] for trace in chart["data"]}
        assert colours == {"v2": SIDE_COLOURS[0], "v1": SIDE_COLOURS[1]}, chart["layout"].get("title")


def test_labels_page_lists_scenario_labels(recorded_home: Path, ui_env: pytest.MonkeyPatch) -> None:
    at = open_app(recorded_home, ui_env, "_pages_labels.py")
    real = next(p.name for p in (recorded_home / "replays").iterdir() if p.name != SYNTHETIC_REPLAY)
    labels = scalar(f"SELECT labels FROM read_parquet('{recorded_home}/replays/{real}/summary/*.parquet')")
    assert metrics(at)["Labels"] == f"{labels:,}"
    assert shown_total(at) == labels
    assert at.get("download_button")


@pytest.mark.parametrize("page", ["_pages_overview.py", "_pages_runs.py", "_pages_run.py", "_pages_diagnoses.py",
                                  "_pages_validators.py", "_pages_prompts.py", "_pages_labels.py"])
def test_every_page_on_an_empty_home_says_what_is_missing(tmp_path: Path, ui_env: pytest.MonkeyPatch,
                                                          page: str) -> None:
    at = open_app(tmp_path, ui_env, page)
    assert at.info or at.warning, page
    assert not at.error


def test_a_corrupt_file_is_a_message(recorded_home: Path, tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    import shutil

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    (tmp_path / "traces" / "runs" / "zz-broken.parquet").write_bytes(b"PAR1 garbage")
    at = open_app(tmp_path, ui_env)
    assert any("zz-broken.parquet" in e.value for e in at.error)
    at.switch_page("_pages_runs.py").run()
    assert not at.exception and at.error


def test_imported_runs_are_compared_and_listed_with_their_reward(tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    import json

    lines = [json.dumps({"messages": [{"role": "system", "content": policy}, {"role": "user", "content": f"task {i}"},
                                      {"role": "assistant", "content": "done"}],
                         "metadata": {"id": f"{policy}-{i}", "task_id": f"t{i}", "reward": reward}})
             for policy, rewards in (("policy A", (1, 1, 0)), ("policy B", (0, 0, 0))) for i, reward in enumerate(rewards)]
    home = imported_home(tmp_path, lines)
    at = open_app(home, ui_env, "_pages_prompts.py")
    shown = at.table[0].value
    a, b = shown.columns[:2]
    # Every imported run SUCCEEDED; two of policy A's three tasks were solved, none of B's.
    assert {shown.loc["Success rate", a], shown.loc["Success rate", b]} == {"100.0% [43.9%–100.0%] (3/3)"}
    assert sorted([shown.loc["Task solved (reward)", a][-5:], shown.loc["Task solved (reward)", b][-5:]]) == \
        ["(0/3)", "(2/3)"]
    assert sorted(frame_with(at, "task_id")["task_id"]) == ["t0", "t1"]
    # No usage in these chats: unknown, not "nan" and not 0, and the page says so.
    assert {shown.loc["Total cost (USD)", a], shown.loc["Mean tokens", b], shown.loc["Mean cost (USD)", "B − A"]} \
        == {"—"}
    assert any("over the runs that report them" in c.value and "tokens 0, cost 0 of 3 runs" in c.value
               for c in at.caption), [c.value for c in at.caption]
    at.switch_page("_pages_runs.py").run()
    assert not at.exception
    assert sorted(frame_with(at, "reward", "status")["reward"]) == [0.0] * 4 + [1.0] * 2


def test_usage_an_import_does_not_give_is_shown_as_unknown(tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    import json

    def chat(i: int, **usage: object) -> str:
        return json.dumps({"messages": [{"role": "user", "content": f"task {i}"},
                                        {"role": "assistant", "content": "done", **usage}],
                           "metadata": {"id": f"chat-{i}", "task_id": f"t{i}"}})

    lines = [chat(0, usage={"prompt_tokens": 90, "completion_tokens": 10}, cost=0.25), chat(1), chat(2),
             chat(3, usage={"prompt_tokens": 150})]  # the prompt's tokens only: 150 known, no cost
    home = imported_home(tmp_path, lines)
    at = open_app(home, ui_env)
    shown = {m.label: m for m in at.metric}
    assert (shown["Tokens"].value, shown["Cost (USD)"].value) == ("250", "0.2500")
    assert "over the 1 of 4 runs that report it" in shown["Cost (USD)"].proto.help
    assert "over the 2 of 4 runs that report it" in shown["Tokens"].proto.help
    unpriced = scalar(f"SELECT run_id FROM {table(home, 'runs')} WHERE task_id = 't1'")
    at = open_app(home, ui_env, run_id=unpriced)
    assert (metrics(at)["Tokens"], metrics(at)["Cost (USD)"]) == ("—", "—")
    for page in ("_pages_prompts.py", "_pages_runs.py"):
        at.switch_page(page).run()
        assert not at.exception and not at.error, page


def test_an_unreadable_replay_is_a_warning_and_the_pages_still_answer(recorded_home: Path, tmp_path: Path,
                                                                        ui_env: pytest.MonkeyPatch) -> None:
    import shutil

    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("*.sqlite*"))
    for victim in (home / "replays" / SYNTHETIC_REPLAY / "summary").glob("*.parquet"):
        victim.write_bytes(b"PAR1 garbage")
    at = open_app(home, ui_env)
    assert not at.error and metrics(at)["Runs"]
    at.switch_page("_pages_validators.py").run()
    assert not at.exception and not at.error
    assert any(SYNTHETIC_REPLAY in w.value and "cannot be read" in w.value for w in at.warning)


def test_an_unreadable_table_fails_its_tab_of_the_run_page_only(recorded_home: Path, tmp_path: Path,
                                                                 ui_env: pytest.MonkeyPatch) -> None:
    import shutil

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    for victim in (tmp_path / "traces" / "operations").glob("*.parquet"):
        victim.write_bytes(b"PAR1 garbage")
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'operations')} ORDER BY run_id LIMIT 1")
    at = open_app(tmp_path, ui_env, run_id=run_id)
    assert not at.exception
    assert metrics(at)["Status"]  # the header is there
    assert [e.value for e in at.error if "operations" in e.value] and len(at.error) == 1
    assert frame_with(at, "validator", "verdict") is not None  # the decisions tab too


def test_an_imported_run_without_decisions_can_be_labelled_as_a_whole(tmp_path: Path,
                                                                      ui_env: pytest.MonkeyPatch) -> None:
    import json

    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
              "metadata": {"id": "one"}}
    home = imported_home(tmp_path, [json.dumps(record)])
    run_id = scalar(f"SELECT run_id FROM {table(home, 'runs')}")
    at = open_app(home, ui_env, run_id=run_id)
    form = f"label_form:{run_id}:0"
    assert at.selectbox(key=f"{form}:pick").options == ["step 1.1 · (the candidate as a whole)"]
    at.selectbox(key=f"{form}:pick").set_value(0)
    at.radio(key=f"{form}:verdict").set_value("reject")
    at.button(key=f"FormSubmitter:{form}-Save label").click().run()
    assert not at.exception and not at.error
    assert list(frame_with(at, "expected_verdict", "source")["source"]) == ["human"]


def test_an_unreadable_events_file_fails_only_what_reads_the_events(recorded_home: Path, tmp_path: Path,
                                                                     ui_env: pytest.MonkeyPatch) -> None:
    """The Overview's counts and rates read the runs, the Run page's header
    and tabs their own tables: one broken events segment blanked both."""
    import shutil

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    victim = sorted((tmp_path / "traces" / "events").glob("*.parquet"))[0]
    victim.write_bytes(b"not parquet at all")
    at = open_app(tmp_path, ui_env)
    assert not at.exception
    runs = scalar(f"SELECT count(*) FROM {table(recorded_home, 'runs')}")
    assert metrics(at)["Runs"] == f"{runs:,}"
    assert [e.value for e in at.error if victim.name in e.value] and len(at.error) == 1
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'operations')} ORDER BY run_id LIMIT 1")
    at = open_app(tmp_path, ui_env, run_id=run_id)
    assert not at.exception and metrics(at)["Status"]
    assert frame_with(at, "validator", "verdict") is not None and frame_with(at, "operation_id", "outcome") is not None
    assert at.error and all(victim.name in e.value for e in at.error)


def test_an_unreadable_loop_diagnoses_file_leaves_out_only_what_counts_findings(recorded_home: Path, tmp_path: Path,
                                                                                ui_env: pytest.MonkeyPatch) -> None:
    """One broken findings file blanked the whole Overview, the Runs list and
    the prompt comparison (their loop figures come first): now each says
    what it leaves out and shows the rest; the pages about findings say the
    file is broken."""
    import shutil

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    victim = sorted((tmp_path / "traces" / "loop_diagnoses").glob("*.parquet"))[-1]
    victim.write_bytes(b"PAR1 garbage")
    runs = table(recorded_home, "runs")
    at = open_app(tmp_path, ui_env)
    assert not at.exception and not at.error
    shown = metrics(at)
    assert shown["Runs"] == f"{scalar(f'SELECT count(*) FROM {runs}'):,}" and shown["Loop rate"] == "—"
    (warning,) = [w.value for w in at.warning if victim.name in w.value]
    assert "the loop rate" in warning.lower()
    at.switch_page("_pages_runs.py").run()
    assert not at.exception and not at.error and shown_total(at) == scalar(f"SELECT count(*) FROM {runs}")
    assert [w.value for w in at.warning if victim.name in w.value]
    at.switch_page("_pages_prompts.py").run()
    assert not at.exception and not at.error
    assert "Loop rate" not in at.table[0].value.index and "Success rate" in at.table[0].value.index
    at.switch_page("_pages_diagnoses.py").run()
    assert [e.value for e in at.error if victim.name in e.value]
    run_id = scalar(f"SELECT run_id FROM read_parquet('{recorded_home}/traces/loop_diagnoses/*.parquet') LIMIT 1")
    at = open_app(tmp_path, ui_env, run_id=run_id)
    assert not at.exception and metrics(at)["Status"]
    assert [e.value for e in at.error if victim.name in e.value]


def test_an_unreadable_labels_file_fails_only_the_figures_against_labels(recorded_home: Path, tmp_path: Path,
                                                                          ui_env: pytest.MonkeyPatch) -> None:
    import shutil

    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("*.sqlite*"))
    (home / "traces" / "labels" / "zz-broken.parquet").write_bytes(b"PAR1 garbage")
    at = open_app(home, ui_env, page="_pages_validators.py")
    assert not at.exception
    shown = metrics(at)
    assert shown["Flips"] != "—" and (shown["Regressions"], shown["Fixes"]) == ("—", "—")
    assert [e.value for e in at.error if "zz-broken.parquet" in e.value] and len(at.error) == 1


def test_a_version_run_under_two_prompt_texts_is_said_and_an_empty_rate_is_no_rate(tmp_path: Path,
                                                                                   ui_env: pytest.MonkeyPatch) -> None:
    """A home's prompts/v3.md edited between two batches: both say v3, their
    prompt_hash differs, and the page pooled them silently. A version with
    no finished run had a 0.0% rate (0/0) and a difference from it."""
    from ui_kit import cli

    home = tmp_path / "home"
    (home / "prompts").mkdir(parents=True)
    happy = str(REPO / "datasets" / "scenarios" / "happy-read-file.yaml")
    waits = str(REPO / "datasets" / "scenarios" / "approval-waits-for-person.yaml")
    assert cli("run", happy, "--home", str(home), "--prompt-version", "v1").returncode == 0
    for text in ("Answer briefly.", "Answer in full sentences."):
        (home / "prompts" / "v3.md").write_text(text)
        assert cli("run", happy, "--home", str(home), "--prompt-version", "v3").returncode == 0
    (home / "prompts" / "v4.md").write_text("Ask first.")
    assert cli("run", waits, "--home", str(home), "--prompt-version", "v4").returncode == 0  # waits: not finished
    hashes = scalar(f"SELECT count(DISTINCT prompt_hash) FROM {table(home, 'candidates')} WHERE prompt_version = 'v3'")
    assert hashes == 2
    at = open_app(home, ui_env, "_pages_prompts.py")
    assert [w.value for w in at.warning if "v3" in w.value and "2 different prompt texts" in w.value]
    at.selectbox[1].select("v4").run()
    shown = at.table[0].value
    assert shown.loc["Success rate", "v4"] == "— (0/0)" and shown.loc["Success rate", "B − A"] == "—"
    assert not [w.value for w in at.warning if "different prompt texts" in w.value]


def test_recorded_decisions_of_two_suites_are_said_to_be_pooled(tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    """Runs recorded under the default suite and under the strict one: the
    recorded side holds two suite versions, which Compare validators and
    Loop diagnoses pooled without a word."""
    import yaml
    from ui_kit import cli

    home = tmp_path / "home"
    loop = yaml.safe_load((REPO / "datasets" / "scenarios" / "loop-repeated-call.yaml").read_text())
    strict = {**loop, "id": "loop-repeated-call-strict", "suite": "strict"}
    (tmp_path / "strict.yaml").write_text(yaml.safe_dump(strict))
    for path in (REPO / "datasets" / "scenarios" / "loop-repeated-call.yaml", tmp_path / "strict.yaml"):
        assert cli("run", str(path), "--home", str(home)).returncode in (0, 1)
    assert cli("replay", "--suite", "default", "--home", str(home), "--fail-on", "never").returncode == 0
    suites = scalar(f"SELECT count(DISTINCT suite_version) FROM {table(home, 'validations')}")
    assert suites == 2
    at = open_app(home, ui_env, "_pages_validators.py")
    assert [w.value for w in at.warning if "2 suite versions" in w.value]
    at.switch_page("_pages_diagnoses.py").run()
    assert not at.exception and [w.value for w in at.warning if "2 suite versions" in w.value]


def test_findings_of_a_replay_without_its_traces_do_not_claim_how_the_runs_ended(
        recorded_home: Path, tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    import shutil

    replay_id = next(p.name for p in (recorded_home / "replays").iterdir()
                     if (p / "loop_diagnoses").is_dir() and list((p / "loop_diagnoses").glob("*.parquet"))
                     and scalar(f"SELECT count(*) FROM read_parquet('{p}/loop_diagnoses/**/*.parquet')"))
    home = tmp_path / "home"
    shutil.copytree(recorded_home / "replays" / replay_id, home / "replays" / replay_id)
    at = open_app(home, ui_env, "_pages_diagnoses.py")
    assert not at.exception
    shown = metrics(at)
    assert shown["Runs with a finding"] != "0" and shown["Of them failed"] == "—"


def test_findings_of_two_versions_of_a_detector_are_shown_apart(recorded_home: Path, tmp_path: Path,
                                                                 ui_env: pytest.MonkeyPatch) -> None:
    """Traces recorded before a detector's new version: one bar added them up."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path / "home"
    shutil.copytree(recorded_home, home, ignore=shutil.ignore_patterns("*.sqlite*"))
    path = next(p for p in sorted((home / "traces" / "loop_diagnoses").glob("*.parquet")) if pq.read_metadata(p).num_rows)
    rows = pq.read_table(path)
    versions = rows.column("detector_version").to_pylist()
    versions[0] = "0"
    pq.write_table(rows.set_column(rows.schema.get_field_index("detector_version"), "detector_version",
                                   pa.array(versions, rows.schema.field("detector_version").type)), path)
    at = open_app(home, ui_env, "_pages_diagnoses.py")
    assert not at.exception and [w.value for w in at.warning if "two versions" in w.value]
    assert "detector_version" in frame_with(at, "run_id", "pattern").columns


def test_a_home_without_a_journal_says_so_before_the_label_form(recorded_home: Path, tmp_path: Path,
                                                                  ui_env: pytest.MonkeyPatch) -> None:
    import shutil

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'candidates')} ORDER BY run_id LIMIT 1")
    at = open_app(tmp_path, ui_env, run_id=run_id)
    assert not at.exception
    assert [i.value for i in at.info if i.value.startswith(f"No journal at {tmp_path / 'journal.sqlite'}")]
    assert not [s for s in at.selectbox if str(s.key).startswith("label_form:")]  # no form to fill in in vain


def test_the_run_page_shows_an_imported_runs_reward(tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    import json

    record = {"messages": [{"role": "user", "content": "cancel my order"}, {"role": "assistant", "content": "done"}],
              "metadata": {"id": "r0", "reward": 0}}
    home = imported_home(tmp_path, [json.dumps(record)])
    run_id = scalar(f"SELECT run_id FROM {table(home, 'runs')}")
    at = open_app(home, ui_env, run_id=run_id)
    assert metrics(at)["Status"] == "SUCCEEDED"
    assert [m.value for m in at.markdown if m.value.startswith("**Reward** 0:")]


def test_a_readable_file_with_a_column_of_another_kind_is_named(recorded_home: Path, tmp_path: Path,
                                                                  ui_env: pytest.MonkeyPatch) -> None:
    """A file written by something else (``steps`` as text): DuckDB's binder
    error named neither the table nor the file."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    foreign = tmp_path / "traces" / "runs" / "zz-foreign.parquet"
    pq.write_table(pa.table({"run_id": ["x"], "status": ["SUCCEEDED"], "steps": ["three"]}), foreign)
    at = open_app(tmp_path, ui_env)
    assert [e.value for e in at.error
            if e.value.startswith(f"Could not read the `runs` table: {foreign} holds column `steps` as string")]


def test_categorical_text_is_text(recorded_home: Path, tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    """pandas, polars and pyarrow may write a text column dictionary-encoded:
    it is read as the text it is, not taken for a column of another kind."""
    import shutil

    import pyarrow.parquet as pq

    shutil.copytree(recorded_home / "traces", tmp_path / "traces")
    (path,) = list((tmp_path / "traces" / "runs").glob("*.parquet"))
    t = pq.read_table(path)
    for name in ("run_id", "status"):
        t = t.set_column(t.schema.get_field_index(name), name, t.column(name).dictionary_encode())
    pq.write_table(t, path)
    at = open_app(tmp_path, ui_env)
    assert not at.exception and not at.error
    runs = scalar(f"SELECT count(*) FROM {table(recorded_home, 'runs')}")
    assert metrics(at)["Runs"] == f"{runs:,}"


def test_a_column_of_another_kind_fails_every_query_of_its_table_alike(recorded_home: Path, tmp_path: Path,
                                                                       ui_env: pytest.MonkeyPatch) -> None:
    """``step`` written as text in one validations file: the comparison
    failed with A = a replay and worked with the sides swapped, and the Run
    page listed the file's decisions with no word. Now every reader of the
    table names the file and the column."""
    import shutil

    import pyarrow.parquet as pq

    shutil.copytree(recorded_home, tmp_path / "home")
    home = tmp_path / "home"
    victim = sorted((home / "traces" / "validations").glob("*.parquet"))[0]
    t = pq.read_table(victim)
    pq.write_table(t.set_column(t.schema.get_field_index("step"), "step", t.column("step").cast("string")), victim)
    said = f"Could not read the `validations` table: {victim} holds column `step` as string, expected int"
    at = open_app(home, ui_env, "_pages_validators.py")
    for a, b in (("recorded", SYNTHETIC_REPLAY), (SYNTHETIC_REPLAY, "recorded")):
        at.selectbox(key="cmp_a").set_value(a)
        at.selectbox(key="cmp_b").set_value(b).run()
        assert any(e.value.startswith(said) for e in at.error), (a, b, [e.value for e in at.error])
    run_id = t.column("run_id")[0].as_py()
    at = open_app(home, ui_env, run_id=run_id)
    assert any(e.value.startswith(said) for e in at.error), [e.value for e in at.error]
    assert not at.exception


def test_the_run_page_remembers_its_run_and_other_pages_drop_a_run_id(recorded_home: Path,
                                                                       ui_env: pytest.MonkeyPatch) -> None:
    """Back from a run left ``/runs?run_id=...``; the sidebar's Run page
    then forgot the run just looked at ("Pick a run")."""
    run_id = scalar(f"SELECT run_id FROM {table(recorded_home, 'runs')} ORDER BY run_id LIMIT 1")
    at = open_app(recorded_home, ui_env, run_id=run_id)
    assert metrics(at)["Status"]
    at.query_params["run_id"] = run_id  # as the browser's Back brings it to the Runs page
    at.switch_page("_pages_runs.py").run()
    assert not at.exception and "run_id" not in at.query_params
    at.switch_page("_pages_run.py").run()
    assert not at.exception and metrics(at)["Status"]
    assert at.query_params["run_id"] in (run_id, [run_id])


def test_a_run_without_a_reason_shows_a_dash_and_can_be_filtered_by_it(tmp_path: Path,
                                                                       ui_env: pytest.MonkeyPatch) -> None:
    """A run whose process died before it ended has no reason: the Run page
    says "—" (not "nan"), and the Runs page's reason filter offers
    "(none)", as the Overview's chart names it."""
    import os
    import subprocess
    import sys

    from loopledger.ui import _queries as q

    home, loopledger = tmp_path / "home", str(Path(sys.executable).with_name("loopledger"))
    scenarios = REPO / "datasets" / "scenarios"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLEDGER_")}
    subprocess.run([loopledger, "run", str(scenarios / "happy-two-reads-one-candidate.yaml"), "--home", str(home)],
                   env=env, check=True, capture_output=True)
    died = subprocess.run([loopledger, "run", str(scenarios / "happy-refund.yaml"), "--home", str(home)],
                          env={**env, "LOOPLEDGER_CRASH_AFTER_COMMITS": "3"}, capture_output=True)
    assert died.returncode == -9
    subprocess.run([loopledger, "export", "--home", str(home)], env=env, check=True, capture_output=True)
    crashed = scalar(f"SELECT run_id FROM {table(home, 'runs')} WHERE reason IS NULL")
    assert metrics(open_app(home, ui_env, run_id=crashed))["Reason"] == "—"
    at = open_app(home, ui_env, page="_pages_runs.py")
    (reason,) = [m for m in at.multiselect if m.label == "Reason"]
    assert q.NO_REASON in reason.options
    reason.set_value([q.NO_REASON]).run()
    assert shown_total(at) == 1 and list(frame_with(at, "run_id", "status")["run_id"]) == [crashed]
    reason.set_value([q.NO_REASON, "completed"]).run()
    assert shown_total(at) == 2


def test_a_page_reads_one_set_of_files_from_first_figure_to_last(recorded_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The page holds the export lock (shared) while it is drawn, so an
    export waits for the whole page, not only for each query; a page that
    exports itself (a label saved) lets go first."""
    import fcntl

    from loopledger.ui import _st

    monkeypatch.setenv("LOOPLEDGER_HOME", str(recorded_home))
    lock_path = recorded_home / "traces" / ".export.lock"
    seen: list[bool] = []

    def exporter_could_publish() -> bool:
        with open(lock_path, "a+b") as other:
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(other.fileno(), fcntl.LOCK_UN)
            return True

    def body() -> None:
        seen.append(exporter_could_publish())
        _st.let_exports_in()
        seen.append(exporter_could_publish())

    _st.guarded("test", body)
    assert seen == [False, True]
    assert exporter_could_publish()  # and after the page


def test_grids_write_control_characters_out(tmp_path: Path, ui_env: pytest.MonkeyPatch) -> None:
    """An imported task id holding a bell and an escape sequence is shown
    written out in the Runs grid, as the page headers show it."""
    import json

    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "done"}],
              "metadata": {"id": "r0", "task_id": "ctrl\x07bell\x1b[1m"}}
    home = imported_home(tmp_path, [json.dumps(record)])
    at = open_app(home, ui_env, page="_pages_runs.py")
    assert list(frame_with(at, "run_id", "task_id")["task_id"]) == ["ctrl\\x07bell\\x1b[1m"]
