"""Offline re-evaluation of recorded traces: validators, loop detectors and
completion gates re-run over stored candidates, without any model call.

    from loopledger.replay import replay

    result = replay("loopledger-data/traces", "strict", write_to="loopledger-data/replays")
    result.summary.flips, result.summary.regressions
    for run in result.diverged:               # frozen results keyed by run
        print(run.run_id, run.divergence.describe("strict"))
    result.ok("regressions")                  # the CI gate

The shape follows Temporal's replayer: ``replay`` / ``replay_many`` return
frozen per-run results, and "the run failed" (``RunReplay.status``, data)
is kept apart from "the replay diverged" (``RunReplay.divergence``).
See docs/replay.md.
"""

from ._errors import (
    BaselineNotFound,
    ReplayError,
    ReplayInputError,
    RunTraceError,
    SuiteNotFound,
    TracesError,
    WorkerLost,
)
from ._harness import new_replay_id, read_summary, replay, replay_many
from ._labels import Label, scenario_labels
from ._result import FAIL_ON, REPLAY_ID, Diagnosis, Diff, Divergence, ReplayResult, RunReplay, Summary

__all__ = [
    "FAIL_ON",
    "REPLAY_ID",
    "BaselineNotFound",
    "Diagnosis",
    "Diff",
    "Divergence",
    "Label",
    "ReplayError",
    "ReplayInputError",
    "ReplayResult",
    "RunReplay",
    "RunTraceError",
    "Summary",
    "SuiteNotFound",
    "TracesError",
    "WorkerLost",
    "new_replay_id",
    "read_summary",
    "replay",
    "replay_many",
    "scenario_labels",
]
