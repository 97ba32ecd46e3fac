"""Run states and the one table of legal transitions.

This module is pure data. The controller, the run stores, the replay's
conformance check and the UI's timeline all read :data:`ALLOWED`; nothing
else decides whether a move is legal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class State(str, enum.Enum):
    """A run's state. The value is the name stored in the journal and traces."""

    READY = "READY"
    MODEL_RUNNING = "MODEL_RUNNING"
    VALIDATING = "VALIDATING"
    TOOL_RUNNING = "TOOL_RUNNING"
    RECONCILING = "RECONCILING"
    WAITING_TOOL = "WAITING_TOOL"
    WAITING_USER = "WAITING_USER"
    FINALIZING = "FINALIZING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    CANCEL_UNKNOWN = "CANCEL_UNKNOWN"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    POLICY_STOPPED = "POLICY_STOPPED"
    EXPIRED = "EXPIRED"

    def __str__(self) -> str:
        return self.value

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[State] = frozenset(
    {
        State.SUCCEEDED,
        State.FAILED,
        State.CANCELLED,
        State.CANCEL_UNKNOWN,
        State.BUDGET_EXHAUSTED,
        State.POLICY_STOPPED,
        State.EXPIRED,
    }
)

#: States in which a run holds no worker: it resumes on an outside event.
WAITING: frozenset[State] = frozenset({State.WAITING_TOOL, State.WAITING_USER})

#: The state a new run starts in.
INITIAL: State = State.READY

_S = State

#: Every legal move. A terminal state is reachable only from FINALIZING, and
#: nothing leaves a terminal state.
ALLOWED: Mapping[State, frozenset[State]] = MappingProxyType(
    {
        _S.READY: frozenset({_S.MODEL_RUNNING, _S.FINALIZING}),
        # MODEL_RUNNING -> MODEL_RUNNING is the next attempt on the same context.
        _S.MODEL_RUNNING: frozenset({_S.MODEL_RUNNING, _S.VALIDATING, _S.FINALIZING}),
        _S.VALIDATING: frozenset({_S.TOOL_RUNNING, _S.READY, _S.WAITING_USER, _S.FINALIZING}),
        _S.TOOL_RUNNING: frozenset(
            {_S.READY, _S.WAITING_TOOL, _S.RECONCILING, _S.WAITING_USER, _S.FINALIZING}
        ),
        _S.RECONCILING: frozenset({_S.READY, _S.TOOL_RUNNING, _S.WAITING_USER, _S.FINALIZING}),
        _S.WAITING_TOOL: frozenset({_S.READY, _S.RECONCILING, _S.FINALIZING}),
        _S.WAITING_USER: frozenset({_S.READY, _S.TOOL_RUNNING, _S.FINALIZING}),
        _S.FINALIZING: frozenset({_S.READY, _S.WAITING_TOOL}) | TERMINAL,
        **{terminal: frozenset() for terminal in TERMINAL},
    }
)


def is_allowed(source: State, target: State) -> bool:
    """True when the table allows ``source -> target``."""
    return target in ALLOWED[source]
