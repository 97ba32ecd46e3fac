"""Running many scenarios at once: the engine behind ``loopledger run``.

Concurrency is threads, not asyncio. The journal is SQLite through the
standard ``sqlite3`` module, whose calls block; an event loop would hand
every commit to a thread anyway. A pool of ``concurrency`` worker threads
each drive one run until it ends or waits; commits are serialised by the
store (SQLite has one writer), and everything else (validation, building
artifacts, backends) overlaps. A run that waits for background work holds
no thread: it goes back to a timer and is driven again when it is due.

The recorder is called when runs end or start waiting, coalesced: one
export at a time, covering every run that changed since the last one, and a
final export when the batch is done.
"""

from __future__ import annotations

import heapq
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from loopledger.validators import Suite, load_suite

from ._backends import DemoBackend, Fault
from ._controller import Controller, RunConfig
from ._errors import BadInput
from ._home import Home
from ._model import ScriptedModel
from ._recorder import Recorder
from ._records import NewRun, RunRecord
from ._scenario import Scenario, parse_scenario
from ._states import State, TERMINAL
from ._tools import DEMO_TOOLS
from ._waits import load_secret

#: How long a run waiting for background work sleeps before it is polled again.
POLL_INTERVAL_S = 0.05


@lru_cache(maxsize=32)
def _suite(name: str) -> Suite:
    return load_suite(name)


def config_for(record: RunRecord) -> RunConfig:
    """Rebuild a run's configuration from its frozen spec."""
    scenario = parse_scenario(record.spec, source=f"run {record.run_id}")
    return RunConfig(
        scenario=scenario,
        suite=_suite(scenario.suite),
        model=ScriptedModel(scenario.entries_for(record.prompt_version)),
        faults=tuple(Fault(f.tool, f.call, f.kind) for f in scenario.faults),
    )


def check_tools(scenario: Scenario) -> None:
    """Tools a scenario names outside its model script must exist."""
    known = {t.name for t in DEMO_TOOLS}
    for index, name in enumerate(scenario.contract.allowed_tools or ()):
        if name not in known and "*" not in name:
            raise BadInput(f"{scenario.source}: contract.allowed_tools[{index}]",
                           f"unknown tool {name!r}; known: {', '.join(sorted(known))}")
    for index, fault in enumerate(scenario.faults):
        if fault.tool not in known:
            raise BadInput(f"{scenario.source}: faults[{index}].tool",
                           f"unknown tool {fault.tool!r}; known: {', '.join(sorted(known))}")
    for key in scenario.expect.side_effects:
        if key not in known:
            raise BadInput(f"{scenario.source}: expect.side_effects.{key}", "unknown tool")


@dataclass
class RunOutcome:
    run_id: str
    task_id: str
    prompt_version: str
    status: str
    reason: str | None
    steps: int
    tool_calls: int
    waiting: dict[str, Any] | None = None
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


class _CoalescingRecorder:
    """Exports when asked, at most one export at a time, never more often
    than needed: requests made during an export are served by the next one."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._lock = threading.Lock()
        self._wanted = threading.Event()

    def request(self) -> None:
        self._wanted.set()
        if self._lock.acquire(blocking=False):
            try:
                while self._wanted.is_set():
                    self._wanted.clear()
                    self.recorder.export()
            finally:
                self._lock.release()

    def flush(self) -> None:
        with self._lock:
            self._wanted.clear()
            self.recorder.export()


class Runner:
    def __init__(self, home: Home, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.home = home
        self.store = home.open_store()
        self.backend = DemoBackend(home.root)
        self.controller = Controller(self.store, self.backend, config_for, load_secret(home.root), sleep=sleep)
        self.recorder = _CoalescingRecorder(Recorder(self.store, home.traces))

    def close(self) -> None:
        self.store.close()
        self.backend.close()

    def create(self, scenario: Scenario, prompt_version: str, model_route: str = "scripted") -> str:
        run_id = f"{scenario.id}.{prompt_version}.{secrets.token_hex(4)}"
        self.store.create_run(
            NewRun(
                run_id=run_id,
                task_id=scenario.id,
                tenant=scenario.tenant,
                prompt_version=prompt_version,
                model_route=model_route,
                spec=scenario.spec(),
            )
        )
        return run_id

    def drive_all(self, run_ids: Sequence[str], concurrency: int = 1,
                  on_settled: Callable[[str], None] | None = None) -> None:
        """Drive every run until it is terminal or waits for a person."""
        timers: list[tuple[float, str]] = []
        queue = list(run_ids)
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="run") as pool:
            running: dict[Future[Any], str] = {}
            while queue or running or timers:
                now = time.monotonic()
                while timers and timers[0][0] <= now:
                    queue.append(heapq.heappop(timers)[1])
                while queue and len(running) < max(1, concurrency):
                    run_id = queue.pop(0)
                    running[pool.submit(self.controller.drive, run_id)] = run_id
                if not running:
                    time.sleep(max(0.0, min(POLL_INTERVAL_S, timers[0][0] - time.monotonic())))
                    continue
                timeout = max(0.0, timers[0][0] - time.monotonic()) if timers else None
                done, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
                for future in done:
                    run_id = running.pop(future)
                    view = future.result()  # an engine bug surfaces here, loudly
                    if view.state is State.WAITING_TOOL:
                        heapq.heappush(timers, (time.monotonic() + POLL_INTERVAL_S, run_id))
                        self.recorder.request()
                    else:
                        self.recorder.request()
                        if on_settled is not None:
                            on_settled(run_id)
        self.recorder.flush()

    def outcome(self, run_id: str, scenario: Scenario | None = None) -> RunOutcome:
        record = self.store.get_run(run_id)
        result = RunOutcome(
            run_id=run_id,
            task_id=record.task_id,
            prompt_version=record.prompt_version,
            status=record.state.value,
            reason=record.reason,
            steps=record.step,
            tool_calls=record.tool_calls,
            waiting=record.waiting if record.state not in TERMINAL else None,
        )
        if scenario is not None:
            result.mismatches = self._compare(record, scenario)
        return result

    def _compare(self, record: RunRecord, scenario: Scenario) -> list[str]:
        expect = scenario.expect
        found: list[str] = []
        if expect.status and expect.status != record.state.value:
            found.append(f"status {record.state.value}, expected {expect.status}")
        if expect.reason and expect.reason != record.reason:
            found.append(f"reason {record.reason}, expected {expect.reason}")
        executions = self.backend.side_effects(record.run_id) if expect.side_effects else {}
        for tool, count in expect.side_effects.items():
            seen = executions.get(tool, 0)
            if seen != count:
                found.append(f"{tool} executed {seen} time(s), expected {count}")
        if expect.decisions:
            recorded = {
                (row["step"], row["attempt"], row["validator"]): row["verdict"]
                for row in self.store.facts("validations", record.run_id)
            }
            overall: dict[tuple[int, int], str] = {}
            order = ["accept", "repair", "ask", "reject"]
            for (step, attempt, _), verdict in recorded.items():
                prior = overall.get((step, attempt), "accept")
                overall[(step, attempt)] = max(prior, verdict, key=order.index)
            for d in expect.decisions:
                got = (recorded.get((d.step, d.attempt, d.validator)) if d.validator
                       else overall.get((d.step, d.attempt)))
                if got != d.verdict:
                    who = d.validator or "the suite"
                    found.append(f"step {d.step} attempt {d.attempt}: {who} decided {got}, expected {d.verdict}")
        return found
