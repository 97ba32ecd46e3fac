"""The durable loop: states and transitions, the run journal, the recorder.

The journal (a :class:`RunStore`) is the source of truth for live runs;
every transition is one :class:`Commit`, applied atomically by
compare-and-set on the run's ``state_version``. The :class:`Recorder`
publishes committed rows as the Parquet trace tables. A model is a
:class:`ModelAdapter` that turns a :class:`ModelRequest` into typed stream
events; the route (``scripted``, ``openai:MODEL``, ``anthropic:MODEL``)
picks one, and vendor errors arrive as :class:`ModelError` subclasses.
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
    SchemaVersionError,
    StaleStateVersion,
    TerminalAlreadySet,
    TransitionNotAllowed,
    UnknownRun,
)
from ._decision import decision_input, validated_candidates
from ._home import Home
from ._model import (
    Finish,
    ItemEvent,
    ModelAdapter,
    ModelRequest,
    ScriptedModel,
    StreamError,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    Usage,
)
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
    "Finish",
    "Home",
    "ItemEvent",
    "JournalError",
    "LoopLedgerError",
    "MigrationError",
    "ModelAdapter",
    "ModelAuthError",
    "ModelBadRequest",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimited",
    "ModelRequest",
    "ModelResponseError",
    "ModelServerError",
    "ModelTimeout",
    "NewEvent",
    "NewRun",
    "OperationConflict",
    "Recorder",
    "RunRecord",
    "RunView",
    "RunStore",
    "SQLRunStore",
    "SQLiteRunStore",
    "SchemaVersionError",
    "ScriptedModel",
    "StaleStateVersion",
    "State",
    "StreamError",
    "StreamEvent",
    "TerminalAlreadySet",
    "TextDelta",
    "ToolCallDelta",
    "TransitionNotAllowed",
    "UnknownRun",
    "Usage",
    "arrow_schema",
    "decision_input",
    "is_allowed",
    "now",
    "now_us",
    "validated_candidates",
]
