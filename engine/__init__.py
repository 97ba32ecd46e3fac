"""The durable loop: states and transitions, the run journal, the recorder.

The journal (a :class:`RunStore`) is the source of truth for live runs;
every transition is one :class:`Commit`, applied atomically by
compare-and-set on the run's ``state_version``. The :class:`Recorder`
publishes committed rows as the Parquet trace tables. Model adapters
(``engine/_model.py``; routes ``scripted``, ``openai:MODEL``,
``anthropic:MODEL``) are not imported here, so a replay never loads one;
vendor errors reach the engine as :class:`ModelError` subclasses.
"""

from ._clock import now, now_us
from ._errors import (
    BadInput,
    CommitRejected,
    EngineError,
    JournalError,
    LoopLedgerError,
    MigrationError,
    ModelAuthError,
    ModelBadRequest,
    ModelConnectionError,
    ModelError,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
    RunsStopped,
    SchemaVersionError,
    StaleStateVersion,
    TerminalAlreadySet,
    TransitionNotAllowed,
    UnknownRun,
)
from ._decision import decision_input, validated_candidates
from ._home import Home, open_journal
from ._postgres import PostgresRunStore
from ._recorder import ExportResult, Recorder
from ._records import (
    SCHEMA_VERSION,
    Artifact,
    Commit,
    CommitResult,
    EventRecord,
    NewEvent,
    NewRun,
    RunRecord,
)
from ._sqlite import SQLiteRunStore
from ._states import ALLOWED, INITIAL, TERMINAL, WAITING, State, is_allowed
from ._store import OperationConflict, RunStore, SQLRunStore
from ._tables import TABLES, arrow_schema
from ._view import RunView

__all__ = [
    "ALLOWED",
    "INITIAL",
    "SCHEMA_VERSION",
    "TABLES",
    "TERMINAL",
    "WAITING",
    "Artifact",
    "BadInput",
    "Commit",
    "CommitRejected",
    "CommitResult",
    "EngineError",
    "EventRecord",
    "ExportResult",
    "Home",
    "JournalError",
    "LoopLedgerError",
    "MigrationError",
    "ModelAuthError",
    "ModelBadRequest",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimited",
    "ModelResponseError",
    "ModelServerError",
    "ModelTimeout",
    "NewEvent",
    "NewRun",
    "OperationConflict",
    "PostgresRunStore",
    "Recorder",
    "RunRecord",
    "RunView",
    "RunStore",
    "RunsStopped",
    "SQLRunStore",
    "SQLiteRunStore",
    "SchemaVersionError",
    "StaleStateVersion",
    "State",
    "TerminalAlreadySet",
    "TransitionNotAllowed",
    "UnknownRun",
    "arrow_schema",
    "decision_input",
    "is_allowed",
    "now",
    "now_us",
    "open_journal",
    "validated_candidates",
]
