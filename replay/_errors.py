"""Typed errors of the replay package, with one root.

    ReplayError
    ├── ReplayInputError          the replay cannot start: bad input (exit 2)
    │   ├── TracesError           a trace table is missing, unreadable, or of a
    │   │                         schema version newer than this code reads
    │   ├── SuiteNotFound         the suite reference cannot be loaded
    │   └── BaselineNotFound      the baseline (``--baseline``) names no finished replay
    ├── RunTraceError             one run's trace is incomplete (a candidate or
    │                             context artifact missing); recorded on that
    │                             run's result, never raised out of a replay
    └── WorkerLost                a worker process ended abruptly (killed: out of
                                  memory, a signal): nothing is written (the
                                  command: exit 3)

A candidate whose decision changed is not an error: it is a diff. A run
that failed (``FAILED``, ``loop_detected``...) is data about the run, kept
in :class:`~loopledger.replay.RunReplay` apart from whether its replay
diverged. Constructors take structured arguments and keep them.
"""

from __future__ import annotations

from loopledger._errors import PicklableError


class ReplayError(PicklableError):
    """Root of every error ``loopledger.replay`` raises on purpose."""

    code = "replay_error"


class ReplayInputError(ReplayError):
    """The replay cannot start; ``where`` names the file, table or argument
    (``suite``, ``replay_ids[1]``; the ``replay`` command: its option)."""

    code = "replay_bad_input"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class TracesError(ReplayInputError):
    code = "bad_traces"


class SuiteNotFound(ReplayInputError):
    code = "bad_suite"


class BaselineNotFound(ReplayInputError):
    code = "unknown_baseline"


class RunTraceError(ReplayError):
    """One run cannot be replayed from its trace."""

    code = "incomplete_run_trace"

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"run {run_id}: {reason}")
        self.run_id = run_id
        self.reason = reason


class WorkerLost(ReplayError):
    """A replay worker process ended without returning its partition."""

    code = "replay_worker_lost"

    def __init__(self, reason: str) -> None:
        super().__init__(f"a replay worker process ended abruptly ({reason}); nothing was written. A process "
                         "killed for memory or by a signal does this; run again (with fewer --workers if memory is "
                         "short). From a script, call replay() under `if __name__ == \"__main__\":` (its worker "
                         "processes import the script again)")
        self.reason = reason
