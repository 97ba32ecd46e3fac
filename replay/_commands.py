"""What the ``replay`` and ``label`` commands do, apart from argument
parsing (which stays in ``loopledger._cli``, so ``--help`` imports nothing
heavy)."""

from __future__ import annotations

import os
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


def replay_command(*, home: Any, suite: str, baseline: str, traces: Path | None, fail_on: str,
                   junit: Path | None, markdown: Path | None, workers: int | None) -> int:
    """Run a replay, print and write its reports; return the exit code."""
    from ._harness import replay
    from ._report import print_summary, write_reports

    if fail_on not in FAIL_ON:
        raise ReplayInputError("--fail-on", f"expected one of {', '.join(FAIL_ON)}, got {fail_on!r}")
    _writable(junit, "--junit")
    _writable(markdown, "--markdown")
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


def _recorded_run(home: Any, run_id: str) -> Any:
    """Where ``run_id`` is recorded: the journal (the engine's runs) or the
    trace tables (imported runs, which never were in the journal). Creates
    nothing."""
    from loopledger.engine import UnknownRun
    from loopledger.engine._show import TracedRuns

    if home.has_journal:
        store = home.open_store()
        try:
            store.get_run(run_id)
            return store
        except UnknownRun:
            store.close()
    traced = TracedRuns(home.traces)
    try:
        traced.get_run(run_id)
    except UnknownRun:
        raise ReplayInputError("RUN_ID", f"unknown run {run_id!r}: neither in the journal nor in "
                                         f"{home.traces}") from None
    return traced


def label_command(*, home: Any, run_id: str, step: int, attempt: int, validator: str, expect: str, note: str,
                  source: str) -> dict[str, Any]:
    """Record a label in the journal and export it to ``traces/labels``. The
    run may be the engine's or an imported one (labels name a run, they do
    not need it in the journal)."""
    from loopledger.engine import Recorder
    from loopledger.engine._show import TracedRuns

    if expect not in VERDICTS:
        raise ReplayInputError("--expect", f"expected one of {', '.join(VERDICTS)}, got {expect!r}")
    if source not in SOURCES:
        raise ReplayInputError("--source", f"expected one of {', '.join(SOURCES)}, got {source!r}")
    runs = _recorded_run(home, run_id)
    # The label goes to the journal: the one just read, or, for an imported
    # run, the home's own (made if the home has none yet).
    store = home.open_store() if isinstance(runs, TracedRuns) else runs
    try:
        candidates = {(int(c["step"]), int(c["attempt"])): c["candidate_id"]
                      for c in runs.facts("candidates", run_id)}
        candidate_id = candidates.get((step, attempt))
        if candidate_id is None:
            known = ", ".join(f"{s}/{a}" for s, a in sorted(candidates)) or "none"
            raise ReplayInputError("--step/--attempt",
                                   f"run {run_id} has no candidate at step {step} attempt {attempt}; "
                                   f"step/attempt with candidates: {known}")
        if validator:
            recorded = {v["validator"] for v in runs.facts("validations", run_id)
                        if v["candidate_id"] == candidate_id}
            from loopledger.validators import registered

            if validator not in recorded and validator not in registered():
                raise ReplayInputError("--validator", f"unknown validator {validator!r}; recorded for this "
                                       f"candidate: {', '.join(sorted(recorded)) or 'none'}")
        label = {"run_id": run_id, "step": step, "attempt": attempt, "candidate_id": candidate_id,
                 "validator": validator, "expected_verdict": expect, "source": source, "note": note}
        label["label_id"] = store.add_label(label)
        Recorder(store, home.traces).export()
    finally:
        store.close()
    return label
