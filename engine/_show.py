"""Terminal views of runs: ``loopledger show`` and the demo's comparison."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopledger._text import plain_cells, visible

from ._clock import from_us
from ._errors import UnknownRun
from ._states import WAITING
from ._store import SQLRunStore


def _short(value: Any, width: int = 90) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


class TracedRuns:
    """Runs read back from the trace tables, for the runs the journal does not
    hold (imported ones go straight to the tables). It answers the few
    questions :func:`render_run` asks a store; :class:`UnknownRun` if the
    tables do not hold the run either."""

    def __init__(self, traces: Path) -> None:
        self.traces = traces

    @staticmethod
    def _read(path: Path, **options: Any) -> Any:
        """One trace file as a table; one that cannot be read (cut short,
        not Parquet, without the column asked for) is bad input naming it."""
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path, **options)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a broken file
            from ._errors import BadInput

            raise BadInput(str(path), f"not a readable trace table ({' '.join(str(exc).split())[:300]})") from None

    def _rows(self, name: str, run_id: str) -> list[dict[str, Any]]:
        import pyarrow as pa

        rows: list[dict[str, Any]] = []
        for path in sorted((self.traces / name).glob("*.parquet")):
            table = self._read(path, filters=[("run_id", "=", run_id)])
            for index, field in enumerate(table.schema):
                if pa.types.is_timestamp(field.type):  # the journal's unit: microseconds
                    table = table.set_column(index, field.name, table.column(index).cast(pa.int64()))
            rows += table.to_pylist()
        return rows

    def run_ids(self) -> set[str]:
        """Every run id the runs table holds (none without the table)."""
        ids: set[str] = set()
        for path in sorted((self.traces / "runs").glob("*.parquet")):
            ids.update(self._read(path, columns=["run_id"]).column(0).to_pylist())
        return ids

    def get_run(self, run_id: str) -> Any:
        from types import SimpleNamespace

        from ._errors import UnknownRun
        from ._states import State

        found = self._rows("runs", run_id)
        if not found:
            raise UnknownRun(run_id)
        row = found[-1]
        return SimpleNamespace(**row, state=State(row["status"]), step=row["steps"])

    def events(self, run_id: str) -> list[Any]:
        from types import SimpleNamespace

        return [SimpleNamespace(**e) for e in sorted(self._rows("events", run_id), key=lambda e: e["seq"])]

    def facts(self, table: str, run_id: str) -> list[dict[str, Any]]:
        return sorted(self._rows(table, run_id), key=lambda r: r["seq"])

    def labels(self, run_id: str) -> list[dict[str, Any]]:
        """The run's labels in the trace tables (an importer's, and those
        given since and exported), oldest first."""
        return sorted(self._rows("labels", run_id), key=lambda r: (r.get("created_at") or 0, r.get("label_id") or 0))

    def operations(self, run_id: str) -> list[dict[str, Any]]:
        return sorted(self._rows("operations", run_id), key=lambda o: (o["created_seq"], o["operation_id"]))


#: The run's fields in ``show --json`` after its id and status, in this order.
RUN_FIELDS = ("thread_id", "task_id", "tenant", "prompt_version", "prompt_hash", "model_route", "reason",
              "step", "attempt", "model_attempts", "tool_calls", "tokens_in", "tokens_out", "cost_usd", "reward",
              "state_version", "started_at", "ended_at")


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A journal row for JSON output: each ``*_json`` column as the value it
    holds, under its name without the suffix."""
    out = {}
    for key, value in row.items():
        if key == "spec_json":
            continue
        if key.endswith("_json"):
            out[key.removesuffix("_json")] = json.loads(value) if isinstance(value, str) else value
        else:
            out[key] = value
    return out


#: A label's fields in ``show --json``.
LABEL_FIELDS = ("step", "attempt", "candidate_id", "validator", "expected_verdict", "source", "note", "created_at")


_WAITING_NAMES = frozenset(s.value for s in WAITING)


def time_split(events: Sequence[Any]) -> dict[str, float]:
    """Seconds the run spent in each kind of state, from its transitions
    (waiting is reported apart from processing time, as the UI does): a
    span runs from the transition into a state to the next transition, and
    the current, still open span is not counted. ``queued_s`` is the first
    span, from the run's creation until an engine took it up (its deadline
    counts from then); ``waiting_user_s`` and ``waiting_tool_s`` are the
    waits; ``processing_s`` every other span (time a process was down while
    the run stood in a working state, after a crash, is in it: the journal
    cannot tell it from slow work)."""
    totals = {"processing_s": 0, "queued_s": 0, "waiting_user_s": 0, "waiting_tool_s": 0}
    entered: tuple[str, int] | None = None
    first = True
    for e in events:
        if e.to_state is None:
            continue
        if entered is not None:
            state, since = entered
            if first:
                key = "queued_s"
            else:
                key = f"{state.lower()}_s" if state in _WAITING_NAMES else "processing_s"
            totals[key] += e.ts - since
            first = False
        entered = (e.to_state, e.ts)
    return {key: round(us / 1e6, 6) for key, us in totals.items()}


def operation_errors(events: Sequence[Any], operations: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Each operation's error code (``APPROVAL_DENIED``, ``WAIT_EXPIRED``,
    ``TIMEOUT``, ...), as its last result said: an ``operation_result``
    event, or the completion of the background work it started. An
    operation whose last result had none is not in it."""
    by_work = {op["work_id"]: op["operation_id"] for op in operations if op.get("work_id")}
    codes: dict[str, str | None] = {}
    for e in events:
        if e.kind not in ("operation_result", "work_completed"):
            continue
        payload = json.loads(e.payload_json)
        op_id = payload.get("operation_id") if e.kind == "operation_result" else by_work.get(payload.get("work_id"))
        if op_id is not None:
            codes[op_id] = payload.get("error_code")
    return {op_id: code for op_id, code in codes.items() if code}


def run_document(store: SQLRunStore | TracedRuns, run_id: str) -> dict[str, Any]:
    """Everything ``show`` prints, whole (nothing clipped), as one JSON-ready
    object: the run's fields and status, its events, candidates, decisions,
    operations, loop diagnoses and wait. Times are microseconds since the
    epoch, as in the journal."""
    run = store.get_run(run_id)
    document: dict[str, Any] = {"run_id": run.run_id, "status": run.state.value}
    document.update({name: getattr(run, name, None) for name in RUN_FIELDS})
    waiting = getattr(run, "waiting_json", None)
    document["waiting"] = json.loads(waiting) if isinstance(waiting, str) else waiting
    events = store.events(run_id)
    document["time"] = time_split(events)
    document["events"] = [
        {"seq": e.seq, "ts": e.ts, "kind": e.kind, "from_state": e.from_state, "to_state": e.to_state,
         "step": e.step, "attempt": e.attempt, "state_version": e.state_version, "payload": json.loads(e.payload_json)}
        for e in events
    ]
    document["candidates"] = [_decoded(c) for c in store.facts("candidates", run_id)]
    document["decisions"] = [_decoded(d) for d in store.facts("validations", run_id)]
    operations = store.operations(run_id)
    errors = operation_errors(events, operations)
    document["operations"] = [{**_decoded(op), "error_code": errors.get(op["operation_id"])} for op in operations]
    document["loop_diagnoses"] = [_decoded(d) for d in store.facts("loop_diagnoses", run_id)]
    document["labels"] = [{k: lb.get(k) for k in LABEL_FIELDS} for lb in store.labels(run_id)]
    return document


def render_run(store: SQLRunStore | TracedRuns, run_id: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    from loopledger._console import console as stdout_console
    from loopledger.canonical import canonical_json

    # Piped into a file or a test, rich would wrap at 80 columns.
    console = stdout_console()
    run = store.get_run(run_id)

    def shown(value: Any) -> str:
        return escape(visible(str(value)))

    console.print(f"[bold]{shown(run.run_id)}[/]  task {shown(run.task_id)}  tenant {shown(run.tenant)}  "
                  f"prompt {shown(run.prompt_version)}  model {shown(run.model_route)}")
    reward = getattr(run, "reward", None)  # an imported run's outcome score
    cost = "-" if run.cost_usd is None else f"{run.cost_usd:.4f}"
    # in+out; "-" when the source counted neither (an imported run without usage).
    tokens = ("-" if run.tokens_in is None and run.tokens_out is None
              else f"{_or_dash(run.tokens_in)}+{_or_dash(run.tokens_out)}")
    console.print(f"status [bold]{run.state.value}[/]  reason {shown(run.reason)}  steps {run.step}  "
                  f"model attempts {run.model_attempts}  tool calls {run.tool_calls}  "
                  f"tokens {tokens}  cost {cost}"
                  + ("" if reward is None else f"  reward {reward:g}"))
    events = store.events(run_id)
    if events:
        split = time_split(events)
        console.print(f"started {from_us(events[0].ts).strftime('%Y-%m-%d %H:%M:%S')} UTC  "
                      f"queued {split['queued_s']:.3f} s  processing {split['processing_s']:.3f} s  "
                      f"waiting for a person "
                      f"{split['waiting_user_s']:.3f} s  waiting for background work {split['waiting_tool_s']:.3f} s")

    timeline = Table(title="timeline (UTC)")
    for name in ("seq", "time", "step", "att", "event", "detail"):
        timeline.add_column(name)
    day = None
    for e in events:
        move = f"{e.from_state or '∅'} → {e.to_state}" if e.kind in ("transition", "run_created") else e.kind
        detail = "" if e.payload_json == "{}" else _short(e.payload_json)
        when = from_us(e.ts)
        # The date where it changes (a wait may span days), the time of day otherwise.
        at = when.strftime("%H:%M:%S.%f")[:-3] if when.date() == day else when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        day = when.date()
        timeline.add_row(*plain_cells(e.seq, at, e.step, e.attempt, move, detail))
    console.print(timeline)

    candidates = Table(title="candidates")
    for name in ("step", "att", "finish", "items", "context"):
        candidates.add_column(name)
    for c in store.facts("candidates", run_id):
        candidates.add_row(*plain_cells(c["step"], c["attempt"], c["finish_reason"], _short(c["items_json"], 70),
                                        c["context_artifact_id"][:12]))
    console.print(candidates)

    # Every decision of every validated candidate: those that accepted on one
    # line per candidate, each other decision on its own line.
    decisions = Table(title="decisions")
    for name in ("step", "att", "validator", "version", "verdict", "code", "message"):
        decisions.add_column(name)
    by_candidate: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for d in store.facts("validations", run_id):
        by_candidate[(d["step"], d["attempt"])].append(d)
    for (step, attempt), rows in by_candidate.items():
        accepted = [d for d in rows if d["verdict"] == "accept"]
        if accepted:
            decisions.add_row(*plain_cells(step, attempt, ", ".join(d["validator"] for d in accepted), "",
                                           "accept", "ok", f"{len(accepted)} of {len(rows)} validators"))
        for d in rows:
            if d["verdict"] != "accept":
                decisions.add_row(*plain_cells(step, attempt, d["validator"], d["validator_version"],
                                               d["verdict"], d["code"], _short(d["message"], 60)))
    console.print(decisions)

    operations = Table(title="operations")
    for name in ("operation", "tool", "args", "status", "outcome", "error", "sent"):
        operations.add_column(name)
    rows = store.operations(run_id)
    errors = operation_errors(events, rows)
    for op in rows:
        operations.add_row(*plain_cells(op["operation_id"], op["tool"], _short(op["canonical_args_json"], 50),
                                        op["status"], op["outcome"] or "", errors.get(op["operation_id"], ""),
                                        op["dispatch_count"]))
    console.print(operations)

    # The diagnosis and the wait are read whole: they say why the run
    # stopped and what it waits for (the timeline above is clipped).
    for diagnosis in store.facts("loop_diagnoses", run_id):
        evidence = diagnosis["evidence_json"]
        text = (f"step {diagnosis['step']}: {diagnosis['detector']} v{diagnosis['detector_version']} "
                f"{diagnosis['pattern']} {evidence if isinstance(evidence, str) else canonical_json(evidence)}")
        console.print(f"[bold red]loop diagnosis[/] {shown(text)}", soft_wrap=True)
    labels = store.labels(run_id)
    if labels:
        table = Table(title="labels")
        for name in ("step", "att", "validator", "should be", "source", "note"):
            table.add_column(name)
        for lb in labels:
            table.add_row(*plain_cells(lb["step"], lb["attempt"], lb["validator"] or "(candidate)",
                                       lb["expected_verdict"], lb["source"], _short(lb["note"] or "", 60)))
        console.print(table)
    if run.waiting_json:
        waiting = json.loads(run.waiting_json)
        text = (f"for {waiting.get('kind')}: {waiting.get('question') or ''}  expires {waiting.get('expires_at', '')}"
                f"  wait {waiting.get('wait_id', '')}"
                + (f"  answer schema {canonical_json(waiting['schema'])}" if waiting.get("schema") else ""))
        console.print(f"[bold]waiting[/] {shown(text)}", soft_wrap=True)


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def comparison_table(outcomes: Sequence[Any]) -> Any:
    """Prompt versions side by side: outcome counts and per-task results."""
    from rich.table import Table

    by_version: dict[str, list[Any]] = defaultdict(list)
    for o in outcomes:
        by_version[o.prompt_version].append(o)
    versions = sorted(by_version)
    table = Table(title="prompt versions compared")
    table.add_column("")
    for v in versions:
        table.add_column(v, justify="right")
    rows: list[tuple[str, list[str]]] = [("runs", [str(len(by_version[v])) for v in versions])]
    statuses = sorted({o.status for o in outcomes})
    for status in statuses:
        rows.append((status, [str(sum(o.status == status for o in by_version[v])) for v in versions]))
    reasons = Counter(o.reason for o in outcomes if o.reason)
    for reason, _ in reasons.most_common():
        rows.append((f"  reason {reason}", [str(sum(o.reason == reason for o in by_version[v])) for v in versions]))
    # Totals, exactly: a difference of a step or two across a hundred runs
    # must show (a mean rounded to one decimal hid it).
    rows.append(("steps", [f"{sum(o.steps for o in by_version[v]):,}" for v in versions]))
    rows.append(("model attempts", [f"{sum(o.model_attempts for o in by_version[v]):,}" for v in versions]))
    rows.append(("tool calls", [f"{sum(o.tool_calls for o in by_version[v]):,}" for v in versions]))
    rows.append(("tokens", [f"{sum(o.tokens for o in by_version[v]):,}" for v in versions]))
    rows.append(("cost (USD)", [f"{sum(o.cost_usd for o in by_version[v]):.4f}" for v in versions]))
    rows.append(("as expected", [f"{sum(o.ok for o in by_version[v])}/{len(by_version[v])}" for v in versions]))
    for label, cells in rows:
        table.add_row(label, *cells)
    return table


class RunNotFound(UnknownRun):
    """No run has this id, and it is the start of none or of several runs'
    ids (``matches``: those, sorted)."""

    def __init__(self, run_id: str, matches: list[str], where: str) -> None:
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            text = f"{run_id!r} is ambiguous: {len(matches)} runs start with it: {shown}"
        else:
            text = f"unknown run {run_id!r}: {where}"
        Exception.__init__(self, text)
        self.run_id = run_id
        self.matches = matches


def resolve_run(run_id: str, sources: Sequence[Any], where: str) -> tuple[Any, str]:
    """The source (a journal, :class:`TracedRuns`) holding ``run_id``, or
    the one run whose id begins with it (as git takes a commit), and that
    run's whole id; :class:`RunNotFound` otherwise (``where``: where the
    run was looked for, for its message)."""
    holder = _holder(run_id, sources)
    if holder is not None:
        return holder, run_id
    matches = runs_starting_with(run_id, *sources) if run_id else []
    if len(matches) == 1 and (holder := _holder(matches[0], sources)) is not None:
        return holder, matches[0]
    raise RunNotFound(run_id, matches, where)


def _holder(run_id: str, sources: Sequence[Any]) -> Any:
    """The first of ``sources`` that holds ``run_id``, else None."""
    for source in sources:
        try:
            source.get_run(run_id)
        except UnknownRun:
            continue
        return source
    return None


def runs_starting_with(prefix: str, *sources: Any) -> list[str]:
    """The run ids of ``sources`` (a journal, :class:`TracedRuns`) that
    begin with ``prefix``, sorted: ``show`` takes a run by a unique start
    of its id, as git takes a commit."""
    return sorted({run_id for source in sources for run_id in source.run_ids() if run_id.startswith(prefix)})
