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
import os
import secrets
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from loopledger.validators import Suite, SuiteError, Verdict, load_suite

from ._backends import DemoBackend, Fault
from ._clock import pinned
from ._controller import Controller, RunConfig
from ._errors import BadInput, JournalError, NotDrivableHere, RunsNotResumed, RunsStopped
from ._home import Home
from ._model import ScriptedModel
from ._recorder import Recorder
from ._routes import model_for
from ._prompts import load_prompt
from ._records import NewRun, RunRecord
from ._scenario import Scenario, parse_scenario
from ._states import TERMINAL, WAITING, State
from ._tools import DEMO_TOOLS, TOOL_TRAITS
from ._waits import Reply, ReplyRejected, TokenClaims, issue_token, load_secret, token_hash

#: How long a run waiting for background work sleeps before it is polled
#: again (and a run another process held, before it is tried again).
POLL_INTERVAL_S = 0.05
#: Times a run another process holds is tried again (POLL_INTERVAL_S apart)
#: before it is left to that process.
HELD_ELSEWHERE_TRIES = 20

#: States in which a drive that returned left a run to another process:
#: neither ended nor waiting (a drive of its own takes a run on from each).
_HELD_ELSEWHERE = frozenset(State) - TERMINAL - WAITING


@lru_cache(maxsize=32)
def _suite(name: str) -> Suite:
    return load_suite(name)


#: Scenarios parsed from run specs, by the spec's canonical JSON: runs of the
#: same scenario share it (a Scenario is frozen); each gets its own source.
_SCENARIOS: OrderedDict[str, Scenario] = OrderedDict()
_SCENARIOS_LOCK = threading.Lock()
SCENARIO_CACHE = 256


def scenario_of(record: RunRecord) -> Scenario:
    """The run's scenario, parsed from its frozen spec."""
    source = f"run {record.run_id}"
    with _SCENARIOS_LOCK:
        parsed = _SCENARIOS.get(record.spec_json)
    if parsed is None:
        parsed = parse_scenario(record.spec, source=source, stored=True)
        with _SCENARIOS_LOCK:
            _SCENARIOS[record.spec_json] = parsed
            while len(_SCENARIOS) > SCENARIO_CACHE:
                _SCENARIOS.popitem(last=False)
        return parsed
    return parsed.model_copy(update={"source": source})


def config_for(record: RunRecord) -> RunConfig:
    """Rebuild a run's configuration from its frozen spec."""
    scenario = scenario_of(record)
    try:
        suite = _suite(scenario.suite)
    except SuiteError as exc:
        # The suite it was recorded with cannot be loaded in this process
        # (its file moved, a module of its ``imports`` not importable here):
        # the run cannot be driven here, and stays where it is.
        raise BadInput("suite", f"its suite {scenario.suite!r} cannot be loaded here: {exc}") from None
    return RunConfig(
        scenario=scenario,
        suite=suite,
        # A real model ignores the scenario's scripted entries (CONTRACT).
        model=model_for(record.model_route, lambda: ScriptedModel(scenario.entries_for(record.prompt_version))),
        faults=tuple(Fault(f.tool, f.call, f.kind, tuple(f.candidates or ())) for f in scenario.faults),
    )


def check_tools(scenario: Scenario) -> None:
    """Tools a scenario names outside its model script must exist."""
    known = {t.name for t in DEMO_TOOLS}
    for index, name in enumerate(scenario.contract.allowed_tools or ()):
        if name not in known and "*" not in name:
            raise BadInput(f"{scenario.source}: contract.allowed_tools[{index}]",
                           f"unknown tool {name!r}; known: {', '.join(sorted(known))}")
    sent = sorted(name for name in known if not TOOL_TRAITS[name].control)
    for index, fault in enumerate(scenario.faults):
        if fault.tool not in sent:
            # ask_user is the engine's own: it reaches no backend, so no fault could happen to it.
            why = (f"{fault.tool} is handled by the engine and never sent to a backend, so no fault can happen to it"
                   if fault.tool in known else f"unknown tool {fault.tool!r}")
            raise BadInput(f"{scenario.source}: faults[{index}].tool",
                           f"{why}; expected a tool sent to a backend: {', '.join(sent)}")
    # The backend counts executions of side effects only: a count of any
    # other tool could never be seen, and --check would report it as not run.
    counted = sorted(name for name, traits in TOOL_TRAITS.items() if traits.side_effect)
    for key in scenario.expect.side_effects:
        if key not in counted:
            why = (f"{key} has no side effects, so its calls are not executions the backend counts"
                   if key in known else f"unknown tool {key!r}")
            raise BadInput(f"{scenario.source}: expect.side_effects.{key}",
                           f"{why}; expected a tool whose executions are counted: {', '.join(counted)}")
    try:
        suite = _suite(scenario.suite)
    except SuiteError as exc:
        # A suite file's error names its file and field: kept whole. An
        # unknown name is the scenario's own field.
        raise BadInput(f"{scenario.source}: suite", exc.reason if exc.where == "suite" else str(exc)) from None
    members = {member.name for member in suite.members}
    for index, decision in enumerate(scenario.expect.decisions):
        if decision.validator and decision.validator not in members:
            raise BadInput(f"{scenario.source}: expect.decisions[{index}].validator",
                           f"{decision.validator!r} is not in suite {scenario.suite!r}; expected one of "
                           f"{', '.join(sorted(members))}, or empty for the candidate as a whole")


def check_script(scenario: Scenario, prompt_version: str) -> None:
    """A scripted run needs model entries for its prompt version."""
    model = scenario.model
    if isinstance(model, dict) and prompt_version not in model and "default" not in model:
        raise BadInput(f"{scenario.source}: model",
                       f"no list for prompt version {prompt_version!r} and no default; "
                       f"lists given: {', '.join(sorted(model)) or 'none'}")
    if not scenario.entries_for(prompt_version):
        # It could only end FAILED/model_error before its first step.
        raise BadInput(f"{scenario.source}: model", f"no entry for prompt version {prompt_version!r}; expected "
                                                    "at least one (or run it with --model openai:... / anthropic:...)")


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
    model_attempts: int = 0
    tokens: int = 0  # in and out
    cost_usd: float = 0.0
    #: Why the scenario's scripted reply was refused, for a run left waiting by it.
    reply_refused: str | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches


class _CoalescingRecorder:
    """Exports when asked, in a thread of its own: at most one export at a
    time, never more often than needed (requests made during an export are
    served by the next one), and never in the way of the runs. The batch's
    scheduler, the ``--json`` lines and the polls of background work go on
    while an export writes; an export reads the journal through a
    connection of its own. :meth:`flush` waits for the export under way,
    raises the failure of one that failed, and makes the final export;
    :meth:`close` lets a requested export finish and stops the thread.

    Under ``LOOPLEDGER_CRASH_AFTER_COMMITS`` exports are made in the
    caller's thread, as they are asked for: the hook counts every journal
    commit of the process, and a sweep of crash points must meet the same
    commits on every run."""

    def __init__(self, recorder: Recorder | None) -> None:
        self.recorder = recorder  # None: exports are switched off
        self._in_caller = bool(os.environ.get("LOOPLEDGER_CRASH_AFTER_COMMITS"))
        self._changed = threading.Condition()
        self._wanted = False  # an export was asked for and not begun
        self._busy = False  # the thread is exporting
        self._held = False  # flush() is exporting: the thread waits
        self._closed = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        if self.recorder is None:
            return
        if self._in_caller:
            self.recorder.export()
            return
        with self._changed:
            if self._closed:
                return
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="export", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def _serve(self) -> None:
        assert self.recorder is not None
        while True:
            with self._changed:
                while not self._closed and (not self._wanted or self._held or self._failure is not None):
                    self._changed.wait()
                if not self._wanted or self._failure is not None:
                    return  # closed, with nothing (more) to do
                self._wanted, self._busy = False, True
            try:
                self.recorder.export()
            except BaseException as exc:  # noqa: BLE001 - raised by flush(), in the caller's thread
                with self._changed:
                    self._failure = exc
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _idle(self) -> None:
        """Wait (under ``_changed``) until no export runs, nor is asked for
        and about to begin."""
        while self._busy or (self._wanted and not self._held and self._failure is None and self._thread is not None):
            self._changed.wait()

    def close(self) -> None:
        """Let an export under way, or asked for, finish; stop the thread.
        Its failure is not raised here (the caller is closing, often on
        another error): :meth:`flush` is where exports are made sure of."""
        with self._changed:
            self._idle()
            self._closed = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def flush(self) -> None:
        if self.recorder is None:
            return
        with self._changed:
            while self._busy:
                self._changed.wait()
            failure, self._failure = self._failure, None
            self._wanted, self._held = False, True
        try:
            if failure is not None:
                raise failure
            self.recorder.export()
        finally:
            with self._changed:
                self._held = False
                self._changed.notify_all()


def _server_gone(exc: BaseException) -> bool:
    """An error of PostgreSQL's driver: the journal's server or the
    connection to it failed (the driver is imported only for such a journal)."""
    import sys

    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


class Runner:
    def __init__(self, home: Home, *, sleep: Callable[[float], None] = time.sleep,
                 auto_reply: bool = True, backend: Callable[[Path], Any] = DemoBackend,
                 export: bool = True, signs: bool = True) -> None:
        self.home = home
        #: Deliver a scenario's scripted ``user:`` replies to its waits.
        self.auto_reply = auto_reply
        #: Resume tokens of waits begun by this process (shown once, never stored).
        self.tokens: dict[str, str] = {}
        #: Why a scripted reply was refused, per run.
        self.rejections: dict[str, str] = {}
        #: Runs another process was driving when this one came to them (a
        #: second resume, a live run): theirs to finish and to report.
        self.held_elsewhere: set[str] = set()
        self.store = home.open_store()
        #: The tool backends, made from the data directory (the demo ones by default).
        self.backend = backend(home.root)
        # The signing secret is checked before anything is recorded; a
        # process that signs nothing (``signs=False``: cancel) reads it only
        # should a token come to be signed after all.
        secret = load_secret(home.root) if signs else (lambda: load_secret(home.root))
        self.controller = Controller(self.store, self.backend, config_for, secret, sleep=sleep,
                                     prompts=home.prompts)
        # Written before the terminal state, so a crash right after it
        # cannot lose them (a run in FINALIZING is resumed; a terminal one
        # is not).
        self.controller.before_terminal = self._labels_of
        #: The runs this process creates: held as one batch while it lives,
        #: so that another process's resume leaves them to it.
        self.batch_id = secrets.token_hex(8)
        # Exports when runs end or wait; ``export=False`` (benchmarks that
        # time the engine alone) switches them off.
        recorder = Recorder(self.store, home.traces) if export else None
        if recorder is not None:
            try:
                recorder.claim()  # before anything is recorded: these traces must be this journal's
            except BaseException:
                self.close()
                raise
        self.recorder = _CoalescingRecorder(recorder)

    def close(self) -> None:
        recorder = getattr(self, "recorder", None)  # none yet when the traces were refused
        if recorder is not None:
            recorder.close()  # an export under way, or asked for, reads through the store
        self.store.close()
        self.backend.close()

    def create(self, scenario: Scenario, prompt_version: str, model_route: str = "scripted") -> str:
        run_id = f"{scenario.id}.{prompt_version}.{secrets.token_hex(4)}"
        self.store.hold_batch(self.batch_id)
        self.store.create_run(
            NewRun(
                run_id=run_id,
                task_id=scenario.id,
                tenant=scenario.tenant,
                prompt_version=prompt_version,
                prompt_hash=load_prompt(prompt_version, self.home.prompts).sha256,
                model_route=model_route,
                spec=scenario.spec(),
                backend_id=getattr(self.backend, "identity", None),
                batch_id=self.batch_id,
            )
        )
        return run_id

    def create_all(self, batch: Sequence[tuple[Scenario, str]], model_route: str = "scripted") -> list[str]:
        """Create a batch of runs (scenario, prompt version) in one
        transaction: a process killed while making them leaves all of them
        or none, never a part that a resume would drive while the rest is
        silently never run."""
        self.store.hold_batch(self.batch_id)  # before the transaction: a claim is no write of it
        with self.store.batch():
            return [self.create(scenario, version, model_route) for scenario, version in batch]

    def drive_all(self, run_ids: Sequence[str], concurrency: int = 1,
                  on_settled: Callable[[str], None] | None = None, wait_for_tools: bool = True,
                  leave_waiting: Mapping[str, int] | None = None) -> None:
        """Drive every run until it is terminal or waits for a person (and,
        unless ``wait_for_tools`` is False, until its background work is done).

        ``leave_waiting``: runs that already waited for background work
        (run id → state version) before this call. Such a run is polled
        once: if its work has not completed, it is left waiting as it was.
        Once it moves, it is driven like any other."""
        leave_waiting = leave_waiting or {}
        timers: list[tuple[float, str]] = []
        queue = deque(run_ids)  # runs not yet started
        polls: deque[str] = deque()  # runs under way whose time to look again came
        turn = 0
        self.held_elsewhere = set()
        tries: Counter[str] = Counter()  # of runs another process held
        stopped: list[tuple[str, BaseException]] = []
        left: list[tuple[str, str]] = []  # runs this process cannot drive, and why
        watched: set[str] = set()  # runs this process polls (see SQLRunStore.watch)

        def unwatch(run_id: str) -> None:
            if run_id in watched:
                self.store.unwatch(run_id)
                watched.discard(run_id)

        # Runs driven side by side share fsyncs (see SQLRunStore.group_commit).
        self.store.group_commit = concurrency > 1
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="run") as pool:
            running: dict[Future[Any], str] = {}
            while queue or polls or running or timers:
                now = time.monotonic()
                while timers and timers[0][0] <= now:
                    polls.append(heapq.heappop(timers)[1])
                # Polls and new runs take free slots in turn: behind a long
                # queue a waiting run's deadline would pass unnoticed for
                # seconds, and polls first would keep new runs from starting.
                while (queue or polls) and len(running) < max(1, concurrency):
                    source = polls if polls and (not queue or turn % 2 == 0) else queue
                    turn += 1
                    run_id = source.popleft()
                    running[pool.submit(self._drive_one, run_id)] = run_id
                if not running:
                    time.sleep(max(0.0, min(POLL_INTERVAL_S, timers[0][0] - time.monotonic())))
                    continue
                timeout = max(0.0, timers[0][0] - time.monotonic()) if timers else None
                done, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
                for future in done:
                    run_id = running.pop(future)
                    try:
                        view = future.result()
                    except NotDrivableHere as exc:
                        left.append((run_id, exc.why))
                        unwatch(run_id)
                        continue
                    except Exception as exc:  # noqa: BLE001 - one run's failure must not stop the others
                        if isinstance(exc, (BadInput, JournalError)):
                            raise
                        if _server_gone(exc):
                            # The journal's server, not this run: every run meets it.
                            raise JournalError(f"{self.home.describe_journal()}: {' '.join(str(exc).split())}") \
                                from exc
                        stopped.append((run_id, exc))
                        unwatch(run_id)
                        continue
                    # Under a pinned clock (LOOPLEDGER_NOW) no work ever falls
                    # due: the run is left waiting, for a resume at a later time.
                    unmoved = leave_waiting.get(run_id) == view.state_version
                    # A run another process held is not reported in the state
                    # it was read in, which it may only be passing through (a
                    # wait the other is ending), unless that state is terminal.
                    held = view.state in _HELD_ELSEWHERE or (view.held_elsewhere and view.state not in TERMINAL)
                    polled = view.state is State.WAITING_TOOL and wait_for_tools and not pinned() \
                        and not unmoved and not view.held_elsewhere
                    if polled and (run_id in watched or self.store.watch(run_id)):
                        # Polled until its work is done, by this process, which
                        # says so: another that drives it between two polls
                        # leaves its report to this one.
                        watched.add(run_id)
                        heapq.heappush(timers, (time.monotonic() + POLL_INTERVAL_S, run_id))
                    elif view.state not in TERMINAL and not held and (polled or self.store.watched_elsewhere(run_id)):
                        # Another process polls it (it was driven here between
                        # two of its polls; ``polled``: its watch was refused):
                        # that one reports how it ends, not this one the state
                        # it was found in.
                        self.held_elsewhere.add(run_id)
                        continue
                    elif held and view.batch_id == self.batch_id:
                        # One of this process's own runs that another process
                        # held at that moment (a resume looking it over, or
                        # driving it after a reply): this process answers for
                        # it until it ends or waits, so it tries again.
                        heapq.heappush(timers, (time.monotonic() + POLL_INTERVAL_S, run_id))
                        continue  # nothing of it to export yet
                    elif held:
                        # Another process held it at that moment. Tried again
                        # a little while (it may only have looked it over);
                        # still held after that, it is the other's to finish
                        # and report (and export).
                        tries[run_id] += 1
                        if tries[run_id] < HELD_ELSEWHERE_TRIES:
                            heapq.heappush(timers, (time.monotonic() + POLL_INTERVAL_S, run_id))
                        else:
                            # The other reports it: a watch kept here would
                            # have it leave its report to this process.
                            self.held_elsewhere.add(run_id)
                            unwatch(run_id)
                        continue
                    else:
                        unwatch(run_id)
                        if on_settled is not None:
                            on_settled(run_id)
                    self.recorder.request()
        for run_id in list(watched):
            unwatch(run_id)  # a run stopped or left while watched
        self.recorder.flush()
        if left:
            raise RunsNotResumed(left, RunsStopped(stopped) if stopped else None)
        if stopped:
            raise RunsStopped(stopped)

    def _drive_one(self, run_id: str) -> Any:
        """Drive a run; while it waits for a person and its scenario scripts
        a reply, deliver that reply through the same checks a person's goes
        through (token, state version, expiry, schema). Then record its
        scenario labels."""
        view = self._drive_and_reply(run_id)
        self._labels_of(view)
        return view

    def _labels_of(self, view: Any) -> None:
        if view.spec.get("expect", {}).get("decisions"):  # most runs expect none: no read
            self.record_scenario_labels(view.run_id)

    def record_scenario_labels(self, run_id: str) -> None:
        """Write the run's scenario's ``expect.decisions`` as ``scenario``
        labels (CONTRACT.md), each on the candidate of its step and attempt:
        those the run has reached and that are not written yet. An
        expectation for a step the run never reached names no candidate and
        waits (a later step may come after a reply)."""
        expected = scenario_of(self.store.get_run(run_id)).expect.decisions
        if not expected:
            return
        candidates = {(int(c["step"]), int(c["attempt"])): c["candidate_id"]
                      for c in self.store.facts("candidates", run_id)}
        written = {(lb["step"], lb["attempt"], lb["validator"]) for lb in self.store.labels(run_id)
                   if lb["source"] == "scenario"}
        for d in expected:
            key = (d.step, d.attempt, d.validator)
            if (d.step, d.attempt) in candidates and key not in written:
                self.store.add_label({"run_id": run_id, "step": d.step, "attempt": d.attempt,
                                      "candidate_id": candidates[(d.step, d.attempt)], "validator": d.validator,
                                      "expected_verdict": d.verdict, "source": "scenario",
                                      "note": "expect.decisions"})
                written.add(key)

    def _drive_and_reply(self, run_id: str) -> Any:
        view = self.controller.drive(run_id)
        while True:
            if view.new_token:
                self.tokens[run_id] = view.new_token
            if view.state is not State.WAITING_USER or not self.auto_reply:
                return view
            script = scenario_of(self.store.get_run(run_id)).user
            if view.replies >= len(script):
                return view
            token = self.tokens.get(run_id) or self._token_of_recorded_wait(view)
            if token is None:
                return view
            entry = script[view.replies]
            try:
                view = self.controller.reply(run_id, token, Reply(entry.approve, entry.answer, entry.by, entry.note))
            except ReplyRejected as exc:
                # A scripted reply gets no special treatment: refused, it
                # leaves the run waiting with its token still valid (and
                # the run's line says why).
                self.rejections[run_id] = exc.why
                return self.controller.load(run_id)
            self.tokens.pop(run_id, None)
            self.rejections.pop(run_id, None)

    def _token_of_recorded_wait(self, view: Any) -> str | None:
        """The token of the run's current wait, signed again with the data
        directory's secret, for the scenario's own scripted replies: the
        process that began the wait (and held the token) is gone, a crash
        say, and a resume goes on with the scenario's script. None when the
        run's ``run`` process is alive (it delivers them), or the wait is not
        one this data directory's secret signed."""
        waiting = view.waiting or {}
        if "wait_id" not in waiting or self.controller._maker_alive(view):
            return None
        token = issue_token(self.controller.secret, TokenClaims(
            view.run_id, waiting["wait_id"], waiting["state_version"], waiting["expires_at_us"]))
        return token if token_hash(token) == waiting.get("token_hash") else None

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
            waiting=self._waiting(record),
            model_attempts=record.model_attempts,
            tokens=record.tokens_in + record.tokens_out,
            cost_usd=record.cost_usd,
        )
        if record.state is State.WAITING_USER and run_id in self.rejections:
            result.reply_refused = self.rejections[run_id]
        if scenario is not None:
            result.mismatches = self._compare(record, scenario)
            if result.mismatches and result.reply_refused:
                result.mismatches.append(f"the scenario's scripted reply was refused ({result.reply_refused}), "
                                         "so the run still waits")
        return result

    def _waiting(self, record: RunRecord) -> dict[str, Any] | None:
        """The CONTRACT's ``waiting`` object: kind, approval_id, expires_at and
        the resume token, which only the process that began the wait has."""
        if record.state is State.WAITING_TOOL:
            return {"kind": "tool", "approval_id": None, "expires_at": None, "resume_token": None}
        if record.state is not State.WAITING_USER or not record.waiting:
            return None
        w = record.waiting
        return {"kind": w["kind"], "approval_id": w.get("approval_id"), "expires_at": w.get("expires_at"),
                "resume_token": self.tokens.get(record.run_id)}

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
            # A candidate's overall verdict is its most severe decision, in
            # the validators' own order of severity.
            overall: dict[tuple[int, int], str] = {}
            for (step, attempt, _), verdict in recorded.items():
                prior = overall.get((step, attempt), Verdict.ACCEPT.value)
                overall[(step, attempt)] = max(prior, verdict, key=lambda v: Verdict(v).severity)
            candidates = {(row["step"], row["attempt"]) for row in self.store.facts("candidates", record.run_id)}
            for d in expect.decisions:
                got = (recorded.get((d.step, d.attempt, d.validator)) if d.validator
                       else overall.get((d.step, d.attempt)))
                if got == d.verdict:
                    continue
                who = d.validator or "the suite"
                where = f"step {d.step} attempt {d.attempt}"
                if got is not None:
                    found.append(f"{where}: {who} decided {got}, expected {d.verdict}")
                elif d.step > record.step:
                    found.append(f"step {d.step}: not reached (the run's last step was {record.step}), "
                                 f"expected {who} to decide {d.verdict}")
                elif (d.step, d.attempt) not in candidates:
                    found.append(f"{where}: no candidate was made, expected {who} to decide {d.verdict}")
                elif (d.step, d.attempt) not in overall:
                    # A stream that was not trusted is never validated (docs/scenarios.md).
                    found.append(f"{where}: {who} made no decision (no validator judged this candidate), "
                                 f"expected {d.verdict}")
                else:
                    found.append(f"{where}: {who} made no decision, expected {d.verdict}")
        return found
