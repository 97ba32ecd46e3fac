"""The per-step record the loop detectors read.

One :class:`StepRecord` per step of a run (``step`` increases each time the
run leaves READY for MODEL_RUNNING). Every field is a runtime fact: what the
states were, which calls the runtime resolved, which error codes its
operations returned, what evidence and completed operations it recorded.
Nothing comes from what the model *says* about its progress.

The same fields, as columns, make the step table of the batch detectors
(:data:`STEP_SCHEMA`): one row per (run_id, step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # polars is imported lazily: the live engine never needs it
    import polars as pl

__all__ = ["StepRecord", "STEP_COLUMNS", "step_schema", "steps_frame", "call_key", "progress_counts"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    #: The run.
    run_id: str
    #: Step number within the run (1, 2, ...); records of a run are fed in step order.
    step: int
    #: States the run was in during this step, in order (``READY``, ``MODEL_RUNNING``, ...).
    states: tuple[str, ...] = ()
    #: Tool calls of this step as ``tool:args_hash`` (canonical-arguments
    #: content id), in order; see :func:`call_key`.
    calls: tuple[str, ...] = ()
    #: Error codes the step's operations returned (``RATE_LIMIT``, ...), in order.
    errors: tuple[str, ...] = ()
    #: Evidence entries (kind, subject) first recorded in this step.
    new_evidence: int = 0
    #: Operations that reached a successful terminal result in this step.
    completed_operations: int = 0
    #: Size of the candidate set the runtime tracks (e.g. objects matching a
    #: lookup), when it tracks one; ``None`` otherwise. A step that makes it
    #: smaller than the last known size made progress.
    candidates: int | None = None
    #: A step still being decided: the calls a candidate proposes, before
    #: anything ran (what a live stop decision adds to the finished steps).
    #: It has calls only; the call patterns read it, the error and progress
    #: patterns do not.
    open: bool = False

    def __post_init__(self) -> None:
        if self.open and (self.states or self.errors or self.new_evidence or self.completed_operations
                          or self.candidates is not None):
            raise ValueError(f"run {self.run_id} step {self.step}: an open step has calls only (nothing ran in it), "
                             "not states, errors, progress or candidates")

    def to_dict(self) -> dict[str, Any]:
        out = {
            "run_id": self.run_id,
            "step": self.step,
            "states": list(self.states),
            "calls": list(self.calls),
            "errors": list(self.errors),
            "new_evidence": self.new_evidence,
            "completed_operations": self.completed_operations,
            "candidates": self.candidates,
        }
        if self.open:
            out["open"] = True
        return out


STEP_COLUMNS: tuple[str, ...] = (
    "run_id",
    "step",
    "states",
    "calls",
    "errors",
    "new_evidence",
    "completed_operations",
    "candidates",
)

#: A column the step table may have besides ``STEP_COLUMNS``: ``open``
#: (bool; absent or null is false), as in :attr:`StepRecord.open`.
OPEN = "open"


def call_key(tool: str, args_hash: str) -> str:
    """The identity of a call for loop detection: tool and canonical-arguments hash."""
    return f"{tool}:{args_hash}"


def step_schema() -> dict[str, Any]:
    import polars as pl

    return {
        "run_id": pl.Utf8,
        "step": pl.Int64,
        "states": pl.List(pl.Utf8),
        "calls": pl.List(pl.Utf8),
        "errors": pl.List(pl.Utf8),
        "new_evidence": pl.Int64,
        "completed_operations": pl.Int64,
        "candidates": pl.Int64,
        OPEN: pl.Boolean,
    }


def steps_frame(records: Iterable[StepRecord]) -> pl.DataFrame:
    """The step table (one row per record) the batch detectors take."""
    import polars as pl

    columns: dict[str, list[Any]] = {name: [] for name in (*STEP_COLUMNS, OPEN)}
    for r in records:
        columns["run_id"].append(r.run_id)
        columns["step"].append(r.step)
        columns["states"].append(list(r.states))
        columns["calls"].append(list(r.calls))
        columns["errors"].append(list(r.errors))
        columns["new_evidence"].append(r.new_evidence)
        columns["completed_operations"].append(r.completed_operations)
        columns["candidates"].append(r.candidates)
        columns[OPEN].append(r.open)
    return pl.DataFrame(columns, schema=step_schema())


def progress_counts(
    evidence_before: Sequence[Any], evidence_after: Sequence[Any], operations_before: Sequence[Any], operations_after: Sequence[Any]
) -> tuple[int, int]:
    """``(new_evidence, completed_operations)`` of a step, from the run facts
    before and after it (items with ``kind``/``subject`` and
    ``operation_id``/``outcome`` attributes, e.g. ``Evidence`` and
    ``Operation``). Evidence is new when its (kind, subject) was not seen
    before; an operation is completed when it reached ``success`` in the step.
    """
    seen = {(e.kind, e.subject) for e in evidence_before}
    new = {(e.kind, e.subject) for e in evidence_after} - seen
    done_before = {o.operation_id for o in operations_before if o.outcome == "success"}
    done_after = {o.operation_id for o in operations_after if o.outcome == "success"}
    return len(new), len(done_after - done_before)
