"""Typed errors of the engine, with one root.

    LoopLedgerError
    ├── BadInput                      a user's file or argument is wrong (exit 2)
    └── EngineError
        ├── JournalError              the journal cannot be used (exit 3)
        │   ├── MigrationError
        │   ├── JournalTooNew         a schema migrated by a newer loopledger
        │   ├── ClaimLost             a run's claim lost while it was driven
        │   └── SchemaVersionError    a record newer than this code understands
        ├── UnknownRun
        ├── ModelError                a model provider call failed (``retryable``
        │   │                         and ``retry_after_s`` are data)
        │   ├── ModelRateLimited      429 and spend/ramp limits
        │   ├── ModelAuthError        credentials, permission, billing
        │   ├── ModelBadRequest       the request itself is wrong: resending cannot help
        │   ├── ModelServerError      5xx, overload, conflict
        │   ├── ModelTimeout
        │   ├── ModelConnectionError  the connection failed or broke mid-stream
        │   └── ModelResponseError    the provider answered something unreadable
        └── CommitRejected            a commit was refused; nothing was written
            ├── TransitionNotAllowed  the table does not allow from -> to
            ├── StaleStateVersion     compare-and-set lost: someone else moved first
            └── TerminalAlreadySet    the run already ended (the attempt is kept
                                      as a ``late_event``)

Constructors take structured arguments and keep them as attributes, so
callers branch on data, not on message text. ``code`` is a stable string
that may be persisted.
"""

from __future__ import annotations

from loopledger._errors import PicklableError


class LoopLedgerError(PicklableError):
    """Root of every error loopledger raises on purpose."""

    code = "error"


class BadInput(LoopLedgerError):
    """A user's input is wrong: ``where`` names the file (and field or line)."""

    code = "bad_input"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class EngineError(LoopLedgerError):
    code = "engine_error"


class RunsStopped(EngineError):
    """Runs that an unexpected error stopped while they were driven; the
    others were driven on. Each stopped run stays at its last committed
    state, for a later ``resume``."""

    code = "runs_stopped"

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        run_id, exc = failures[0]
        more = f" ({len(failures)} runs in all; the others were driven on)" if len(failures) > 1 else ""
        detail = " ".join(str(exc).split())[:300]
        super().__init__(f"run {run_id} stopped by an unexpected error: {type(exc).__name__}: {detail}{more}; "
                         "it stays at its last committed state")
        self.failures = failures


class NotDrivableHere(EngineError):
    """A run this process cannot drive: its model route cannot be set up
    here (SDK or key missing), or its tools act on the backend of another
    data directory sharing the journal. It stays at its last committed
    state, for a process that can."""

    code = "not_drivable_here"

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(f"run {run_id} cannot be driven here: {why}")
        self.run_id = run_id
        self.why = why


class RunsNotResumed(RunsStopped):
    """Runs left at their last committed state because this process cannot
    drive them (:class:`NotDrivableHere`); ``stopped``: the runs an
    unexpected error stopped meanwhile, if any."""

    code = "runs_not_resumed"

    def __init__(self, left: list[tuple[str, str]], stopped: RunsStopped | None = None) -> None:
        run_id, why = left[0]
        more = f" ({len(left)} runs in all)" if len(left) > 1 else ""
        message = f"run {run_id} was not resumed: {why}{more}; it stays at its last committed state"
        EngineError.__init__(self, message + (f"; and {stopped}" if stopped is not None else ""))
        self.failures = list(stopped.failures) if stopped is not None else []
        self.left = left


class Unavailable(EngineError):
    """Something a command needs besides the journal (the demo tool
    backends' database) cannot be opened or used: an infrastructure
    failure, as a journal's is, not a fault of the input."""

    code = "unavailable"


class JournalError(EngineError):
    """The journal cannot be opened, migrated or written."""

    code = "journal_error"


class MigrationError(JournalError):
    code = "migration_error"

    def __init__(self, version: int, name: str, reason: str) -> None:
        super().__init__(f"migration {version:04d}_{name} failed: {reason}")
        self.version = version
        self.name = name
        self.reason = reason


class SchemaVersionError(JournalError):
    """A stored record has a schema version this code cannot read."""

    code = "schema_version"

    def __init__(self, table: str, found: int, supported: int) -> None:
        super().__init__(
            f"{table}: record has schema_version {found}, this loopledger reads up to {supported}"
        )
        self.table = table
        self.found = found
        self.supported = supported


class ClaimLost(JournalError):
    """The process no longer holds its claim on a run it was driving (its
    session with the journal's server closed): it sends nothing more, and
    the run stays at its last committed state for a process that holds it."""

    code = "claim_lost"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id}: this process lost its claim on the run (the journal connection holding it "
                         "closed); nothing more was sent, and the run stays at its last committed state for "
                         "`loopledger resume`")
        self.run_id = run_id


class JournalTooNew(JournalError):
    """The journal's schema was migrated by a newer loopledger than this one."""

    code = "journal_too_new"

    def __init__(self, found: int, known: int, where: str = "the journal") -> None:
        super().__init__(f"{where}: its schema is at version {found}, newer than this loopledger knows ({known}): "
                         "a newer loopledger wrote it; use that version (or a newer one) with this journal")
        self.found = found
        self.known = known
        self.where = where


class UnknownRun(EngineError):
    code = "unknown_run"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r} in the journal")
        self.run_id = run_id


class CommitRejected(EngineError):
    """A commit was refused before anything was written."""

    code = "commit_rejected"

    def __init__(self, run_id: str, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class TransitionNotAllowed(CommitRejected):
    code = "transition_not_allowed"

    def __init__(self, run_id: str, source: str, target: str) -> None:
        super().__init__(run_id, f"run {run_id}: transition {source} -> {target} is not allowed")
        self.source = source
        self.target = target


class StaleStateVersion(CommitRejected):
    code = "stale_state_version"

    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        super().__init__(
            run_id, f"run {run_id}: expected state_version {expected}, journal has {actual}"
        )
        self.expected = expected
        self.actual = actual


class TerminalAlreadySet(CommitRejected):
    """The run is terminal. The refused commit's events were kept as ``late_event``."""

    code = "terminal_already_set"

    def __init__(self, run_id: str, terminal: str, attempted: str | None) -> None:
        super().__init__(
            run_id,
            f"run {run_id} already ended in {terminal}; "
            + (f"attempted move to {attempted}" if attempted else "the commit's events") + " kept as late_event",
        )
        self.terminal = terminal
        self.attempted = attempted


class ModelError(EngineError):
    """A model provider call failed. Adapters raise these from the vendor's
    own exceptions (``raise ... from exc``) so the engine never sees an SDK
    type; ``retryable`` says whether a new attempt on the same context can
    succeed, ``retry_after_s`` how long the provider asked to wait."""

    code = "model_error"
    default_retryable = True

    def __init__(self, message: str, *, provider: str, code: str | None = None, retryable: bool | None = None,
                 retry_after_s: float | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.code = code or type(self).code
        self.retryable = self.default_retryable if retryable is None else retryable
        self.retry_after_s = retry_after_s
        #: The HTTP status, when the provider answered with one.
        self.status = status


class ModelRateLimited(ModelError):
    code = "rate_limited"


class ModelAuthError(ModelError):
    code = "auth"
    default_retryable = False


class ModelBadRequest(ModelError):
    code = "bad_request"
    default_retryable = False


class ModelServerError(ModelError):
    code = "server_error"


class ModelTimeout(ModelError):
    code = "timeout"


class ModelConnectionError(ModelError):
    code = "connection"


class ModelResponseError(ModelError):
    code = "bad_response"
