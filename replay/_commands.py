"""What the ``replay`` and ``label`` commands do, apart from argument
parsing (which stays in ``loopledger._cli``, so ``--help`` imports nothing
heavy)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ._errors import ReplayInputError
from ._labels import SOURCES, VERDICTS
from ._result import FAIL_ON

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
#: ``replay()``'s arguments as the ``replay`` command spells them, for its errors.
_OPTIONS = {"suite": "--suite", "baseline": "--baseline", "workers": "--workers"}


def _writable(path: Path | None, option: str) -> None:
    """Refuse a report path that cannot be written, before any work is done."""
    if path is None:
        return
    if path.is_dir():
        raise ReplayInputError(option, f"cannot write {path}: it is a folder; expected a file path")
    if not path.parent.is_dir():
        raise ReplayInputError(option, f"cannot write {path}: no folder {path.parent}")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ReplayInputError(option, f"cannot write {path}: permission denied")
    # Some folders refuse new files whatever their mode says (/proc, a
    # read-only mount): try, and leave nothing behind.
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ReplayInputError(option, f"cannot write {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


def _suite_code(suite: str) -> list[Path]:
    """The files of the Python code ``suite`` runs: the modules its loading
    imports (a ``module:attr`` suite's module, a suite file's ``imports``)."""
    from loopledger.validators import SuiteError, load_suite

    before = set(sys.modules)
    try:
        load_suite(suite)
    except SuiteError:
        return []  # the replay names the problem before it writes anything
    named = {suite.partition(":")[0]} if ":" in suite and not suite.lower().endswith((".yaml", ".yml")) else set()
    if not named and os.path.isfile(suite):
        # A suite file's ``imports``, imported before it was loaded or not.
        from loopledger._yaml import load as load_yaml

        data = load_yaml(Path(suite).read_text(encoding="utf-8"))  # it loaded: it reads
        imports = data.get("imports") if isinstance(data, dict) else None
        named = {name for name in imports or () if isinstance(name, str)}
    files = [getattr(sys.modules.get(name), "__file__", None) for name in (set(sys.modules) - before) | named]
    return [Path(f) for f in files if f]


def _not_recorded_data(path: Path | None, option: str, home: Any, traces: Path | None, suite: str,
                       suite_code: list[Path]) -> None:
    """Refuse a report path that would overwrite what is recorded: the
    journal, what a traces folder holds (the data directory's or
    ``--traces``: its tables, the marker naming their journal, the export
    lock), the replays, the prompts, the secret and the demo backends'
    state (their database and the runs' workspaces), or the suite: its
    file and its code (``suite_code``)."""
    if path is None:
        return
    journal = home.journal_file
    guarded = [(Path(f"{db}{end}"), f"the journal {journal}" if db == journal else f"the data directory's {db.name}")
               for db in (journal, home.root / "demo_backend.sqlite") if db is not None
               for end in ("", "-wal", "-shm", "-journal", "-drivers")]  # -drivers: the journal's lock of its drivers
    guarded += [(home.replays, f"the replays folder {home.replays}"), (home.prompts, f"the prompts folder {home.prompts}"),
                (home.root / "secret.key", f"the data directory's secret {home.root / 'secret.key'}"),
                (home.root / "workspaces", f"the demo backends' workspaces {home.root / 'workspaces'}")]
    # What a traces folder holds (a new report beside it overwrites nothing).
    for folder in {home.traces, *([traces] if traces is not None else [])}:
        if folder.is_dir():
            guarded += [(entry, f"the trace table {entry}" if entry.is_dir() else f"the traces' own {entry}")
                        for entry in folder.iterdir()]
    if suite.lower().endswith((".yaml", ".yml")) or os.path.lexists(suite):  # as load_suite takes a file
        guarded.append((Path(suite), f"the suite file {suite}"))
    guarded += [(code, f"the suite's code {code}") for code in suite_code]
    target = path.resolve()
    for place, what in guarded:
        place = place.resolve()
        if target == place or place in target.parents:
            raise ReplayInputError(option, f"{path} is {what if target == place else 'in ' + what}; a report "
                                           "there would overwrite what is recorded: expected a path outside it")


def replay_command(*, home: Any, suite: str, baseline: str, traces: Path | None, fail_on: str,
                   junit: Path | None, markdown: Path | None, workers: int | None) -> int:
    """Run a replay, print and write its reports; return the exit code."""
    from ._harness import replay
    from ._report import print_summary, write_reports

    if fail_on not in FAIL_ON:
        raise ReplayInputError("--fail-on", f"expected one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    suite_code = _suite_code(suite) if junit is not None or markdown is not None else []
    for path, option in ((junit, "--junit"), (markdown, "--markdown")):
        _not_recorded_data(path, option, home, traces, suite, suite_code)
        _writable(path, option)
    if junit is not None and markdown is not None and junit.resolve() == markdown.resolve():
        raise ReplayInputError("--markdown", f"{markdown} is also the --junit report; expected two different files")
    try:
        result = replay(traces or home.traces, suite, baseline=baseline, write_to=home.replays, workers=workers)
    except ReplayInputError as exc:
        if exc.where not in _OPTIONS:
            raise
        raise type(exc)(_OPTIONS[exc.where], exc.reason) from None
    print_summary(result, fail_on)
    write_reports(result, fail_on, markdown, junit)
    if result.errors:
        first = result.errors[0]
        raise ReplayInputError(f"traces: run {first.run_id}",
                               f"{first.error} ({len(result.errors)} run(s) could not be replayed)")
    return EXIT_OK if result.ok(fail_on) else EXIT_FAILED


def _recorded_run(home: Any, run_id: str) -> tuple[Any, str]:
    """Where ``run_id`` (or the one run whose id begins with it, as ``show``
    takes it) is recorded: the journal (the engine's runs) or the trace
    tables (imported runs, which never were in the journal); and the whole
    id. Creates nothing; the caller closes a journal returned."""
    from loopledger.engine._show import RunNotFound, TracedRuns, resolve_run

    store = home.open_store(to_read=True) if home.has_journal else None
    sources = [source for source in (store, TracedRuns(home.traces)) if source is not None]
    try:
        found, whole = resolve_run(run_id, sources, f"neither in the journal nor in {home.traces}")
    except RunNotFound as exc:
        if store is not None:
            store.close()
        raise ReplayInputError("RUN_ID", str(exc)) from None
    if store is not None and found is not store:
        store.close()
    return found, whole


def _traces_taken(home: Any) -> bool:
    """Whether the home's traces already belong to a journal, with none in
    the home: a journal made now could never export to them."""
    from loopledger.engine._recorder import OWNER_FILE, has_segments

    return not home.has_journal and ((home.traces / OWNER_FILE).exists() or has_segments(home.traces))


def _traces_take_labels(home: Any, store: Any) -> None:
    """Refuse, before a label is written, a home whose traces another journal
    exported (copied from elsewhere): the label could never be exported to
    them, so a replay would never see it."""
    from loopledger.engine import JournalError, Recorder

    try:
        Recorder(store, home.traces).claim()
    except JournalError:
        raise ReplayInputError("--home", _OTHER_JOURNALS.format(traces=home.traces)) from None


_OTHER_JOURNALS = ("{traces} holds traces another journal exported; a label goes to the journal they were "
                   "exported from (its --home or --store), where replays will see it")


def _validated(runs: Any, run_id: str, step: int, attempt: int) -> tuple[str, set[str]]:
    """The candidate at ``step``/``attempt`` and the validators recorded as
    deciding on it. A candidate that never entered VALIDATING (a cut stream,
    an error, a length finish: the engine made a new attempt) is refused: no
    replay decides on it, so a label on it would never count."""
    candidates = {(int(c["step"]), int(c["attempt"])): c for c in runs.facts("candidates", run_id)}
    entered = {(int(e.step), int(e.attempt)) for e in runs.events(run_id)
               if e.kind == "transition" and getattr(e.to_state, "value", e.to_state) == "VALIDATING"}
    candidate = candidates.get((step, attempt))
    if candidate is None or (step, attempt) not in entered:
        known = ", ".join(f"{s}/{a}" for s, a in sorted(candidates) if (s, a) in entered)
        why = (f"has no candidate at step {step} attempt {attempt}" if candidate is None else
               f"never validated its candidate at step {step} attempt {attempt} (finish_reason "
               f"{candidate.get('finish_reason')}: a new attempt followed), so no replay decides on it")
        raise ReplayInputError("--step/--attempt", f"run {run_id} {why}; validated step/attempt: {known or 'none'}")
    candidate_id = candidate["candidate_id"]
    return candidate_id, {v["validator"] for v in runs.facts("validations", run_id)
                          if v["candidate_id"] == candidate_id}


def label_command(*, home: Any, run_id: str, step: int, attempt: int, validator: str, expect: str, note: str,
                  source: str, suite: str | None = None) -> dict[str, Any]:
    """Record a label in the journal and export it to ``traces/labels``. The
    run may be the engine's or an imported one (labels name a run, they do
    not need it in the journal). ``suite``: a suite whose validators (its
    ``imports`` loaded) may be named besides those recorded and registered."""
    from loopledger.engine import Recorder
    from loopledger.engine._show import TracedRuns

    if expect not in VERDICTS:
        raise ReplayInputError("--expect", f"expected one of {', '.join(VERDICTS)}, got {expect!r}")
    if source not in SOURCES:
        raise ReplayInputError("--source", f"expected one of {', '.join(SOURCES)}, got {source!r}")
    members = _suite_members(suite) if suite is not None else set()
    if _traces_taken(home):
        raise ReplayInputError("--home", _OTHER_JOURNALS.format(traces=home.traces))
    runs, run_id = _recorded_run(home, run_id)
    try:
        candidate_id, decided = _validated(runs, run_id, step, attempt)
        if validator and validator not in decided and validator not in members:
            from loopledger.validators import RegistryError, is_known, load_plugins, unknown_validator

            try:
                load_plugins()  # installed plugins may register it
            except RegistryError:
                pass  # one fails to import: the others' names stand, and it is named if this one is unknown
            if not is_known(validator):
                hint = "" if suite is not None else "; a validator of a suite's imports: add --suite SUITE"
                raise ReplayInputError("--validator", f"{unknown_validator(validator)}; nor is it recorded for "
                                       f"this candidate ({', '.join(sorted(decided)) or 'none'}) or one of "
                                       f"--suite's ({', '.join(sorted(members)) or 'none'}){hint}")
    finally:
        if not isinstance(runs, TracedRuns):
            runs.close()
    # Checked: the label goes to the journal (for an imported run, the
    # home's own, made if the home has none yet).
    store = home.open_store()
    try:
        _traces_take_labels(home, store)
        label = {"run_id": run_id, "step": step, "attempt": attempt, "candidate_id": candidate_id,
                 "validator": validator, "expected_verdict": expect, "source": source, "note": note}
        label["label_id"] = store.add_label(label)
        Recorder(store, home.traces).export()
    finally:
        store.close()
    return label


def _suite_members(suite: str) -> set[str]:
    """The validator names of ``suite`` (loading it runs its ``imports``)."""
    from loopledger.validators import SuiteError, load_suite

    try:
        loaded = load_suite(suite)
    except SuiteError as exc:
        raise ReplayInputError("--suite", str(exc)) from None
    return {member.name for member in loaded.members}
