"""The ``loopledger`` command line.

Exit codes (CONTRACT.md): 0 done; 1 a check or a request failed; 2 bad
input, named by file, field and reason; 3 infrastructure failure (the
journal or the disk). Heavy libraries (pyarrow, duckdb, polars, streamlit)
are imported inside the commands that need them, so ``--help`` is instant.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from ._text import plain_cells

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INFRA = 0, 1, 2, 3

app = typer.Typer(
    name="loopledger",
    help="A durable agent loop as a persisted state machine, with offline replay of its decisions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# A string, not a Path: click would hand `--home ""` over as Path(""), which
# reads as the current folder.
HomeOption = Annotated[
    str | None,
    typer.Option("--home", help="Data directory (default: $LOOPLEDGER_HOME, else ./loopledger-data)."),
]
ConcurrencyOption = Annotated[int, typer.Option("--concurrency", min=1, help="Runs driven at once.")]
StoreOption = Annotated[
    str | None, typer.Option("--store", help="Journal URL (default: the SQLite journal in --home).")
]

F = TypeVar("F", bound=Callable[..., Any])


def _err(message: str) -> None:
    """Print one line: a message that spans lines (a server's own, with its
    SQL pointer; click's) has its lines joined."""
    lines = [line.strip() for line in message.splitlines()]
    typer.echo(f"loopledger: {' '.join(line for line in lines if line)}", err=True)


def guarded(fn: F) -> F:
    """Turn the engine's typed errors into one clear line and an exit code,
    never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from loopledger.engine._errors import BadInput, JournalError, LoopLedgerError, RunsStopped, Unavailable

        try:
            from loopledger.engine._faults import check_hooks

            check_hooks()
            _check_text(fn, kwargs)
            return fn(*args, **kwargs)
        except BadInput as exc:
            _err(f"bad input: {exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except JournalError as exc:
            _err(f"journal: {exc}")
            raise typer.Exit(EXIT_INFRA) from None
        except Unavailable as exc:
            _err(str(exc))
            raise typer.Exit(EXIT_INFRA) from None
        except RunsStopped as exc:
            # Not the input: the engine could not finish these runs.
            _err(str(exc))
            raise typer.Exit(EXIT_INFRA) from None
        except LoopLedgerError as exc:
            _err(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except BrokenPipeError:
            raise  # the reader of stdout went away: main() ends the command (141)
        except OSError as exc:
            _err(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
            raise typer.Exit(EXIT_INFRA) from None
        except Exception as exc:
            if not _is_database_error(exc):
                raise
            # The journal or a backend database failed under us (disk full,
            # corruption, a lock held too long, a server gone): infrastructure,
            # not input. A PostgreSQL journal's failure names its URL.
            store = kwargs.get("store") or _GLOBAL["store"]
            _err(f"{_failed_database(exc, store)}: {' '.join(str(exc).split())}")
            raise typer.Exit(EXIT_INFRA) from None

    return wrapper  # type: ignore[return-value]


def _check_text(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Refuse a text argument holding bytes that are not UTF-8 (the shell
    passes them through as lone surrogates, which no journal can store). A
    path may hold such bytes (Linux allows them): those typed as paths are
    not text here, nor are the text options that may name a file."""
    from loopledger.engine._errors import BadInput

    for name, value in kwargs.items():
        if name in _MAY_NAME_A_FILE or not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(_param_label(fn, name), "expected UTF-8 text; it holds bytes that are not") from None


#: Text options that may be a file's path: --home, --store (sqlite:PATH),
#: --suite and --decide (a suite's .yaml).
_MAY_NAME_A_FILE = frozenset({"home", "store", "suite", "decide"})


def _param_label(fn: Callable[..., Any], name: str) -> str:
    """How the user writes a parameter of a command: its option (``--note``)
    or its argument's name (``RUN_ID``)."""
    import typing

    hint = typing.get_type_hints(fn, include_extras=True).get(name)
    for info in getattr(hint, "__metadata__", ()):
        if isinstance(info, typer.models.OptionInfo):
            # Annotated[..., typer.Option("--json")] keeps the flag as its default.
            flags = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str) and d.startswith("--")]
            return flags[0] if flags else "--" + name.replace("_", "-")
        if isinstance(info, typer.models.ArgumentInfo):
            return info.metavar or name.upper()
    return name


def _failed_database(exc: BaseException, store: str | None) -> str:
    """Which database an error of :func:`_is_database_error` came from, as
    far as can be told: PostgreSQL's driver serves only the journal."""
    if store and not isinstance(exc, sqlite3.Error):
        from loopledger.engine._postgres import redact

        return f"journal: {redact(store)}"
    return str(_sqlite_file(exc) or "database")


def _sqlite_file(exc: BaseException) -> Path | None:
    """The SQLite file an error came from: the ``path`` of the innermost
    loopledger object on the traceback that has one (the journal's store,
    the demo backends), since sqlite3's errors do not name their file."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        path = getattr(owner, "path", None)
        if isinstance(path, Path) and type(owner).__module__.startswith("loopledger."):
            found = path
        tb = tb.tb_next
    return found


def _is_database_error(exc: BaseException) -> bool:
    """An error of SQLite or of PostgreSQL's driver (imported only when a
    postgresql:// journal was opened)."""
    if isinstance(exc, sqlite3.Error):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)


#: ``--home`` and ``--store`` given before the command (``loopledger --home
#: DIR run ...``): the defaults of the command's own options.
_GLOBAL: dict[str, str | None] = {"home": None, "store": None}


@app.callback()
def _options(home: HomeOption = None, store: StoreOption = None) -> None:
    """A durable agent loop as a persisted state machine, with offline replay of its decisions."""
    _GLOBAL.update(home=home, store=store)


def _home(home: str | None, store: str | None = None, *, command: str | None = None) -> Any:
    """The data directory (and journal) a command works on; ``command``
    names one without a ``--store`` of its own, which refuses one given
    before it rather than pass over it."""
    from loopledger.engine._errors import BadInput
    from loopledger.engine._home import Home

    home = home if home is not None else _GLOBAL["home"]
    if command is not None and _GLOBAL["store"] is not None:
        raise BadInput("--store", f"{command} reads and writes the data directory (--home) only; expected no "
                                  "--store before it")
    store = store if store is not None else _GLOBAL["store"]
    if home is not None and not home.strip():
        raise BadInput("--home", "expected a folder, got an empty string")
    return Home.resolve(home, store)


def _runner_for(run_id: str, where: Any, no_journal: str | None = None, *, rejecting: bool = False,
                as_json: bool = False) -> Any:
    """A runner (no scripted replies) on the data directory ``where`` for a
    command on one existing run; see :func:`_need_journal`."""
    from loopledger.engine._runner import Runner

    _need_journal(run_id, where, no_journal, rejecting=rejecting, as_json=as_json)
    return Runner(where, auto_reply=False)


def _said(option: str, text: str | None, limit: int) -> str | None:
    """A person's free text for the journal (``--by``, ``--reason``): one
    that is not empty and fits ``limit`` characters, else bad input."""
    from loopledger.canonical import is_unicode
    from loopledger.engine._errors import BadInput

    if text is None:
        return None
    text = text.strip()
    if not text or len(text) > limit or "\x00" in text or not is_unicode(text):
        raise BadInput(option, f"expected text of 1 to {limit:,} characters (no NUL, no unpaired surrogate), "
                               f"got {len(text):,} characters" if text else "expected text, got nothing")
    return text


def _whole_run_id(run_id: str, journal: Any, *, rejecting: bool = False, as_json: bool = False) -> str:
    """``run_id``, or the one run of ``journal`` (the command's own, open)
    whose id begins with it (as ``show`` takes it, and git a commit); exit 1
    when several runs' ids begin with it. An id the journal does not know
    at all is left for the command to refuse as it does."""
    from loopledger.engine._show import RunNotFound, resolve_run

    if not run_id:
        return run_id
    try:
        return resolve_run(run_id, [journal], "")[1]
    except RunNotFound as exc:
        if len(exc.matches) < 2:
            return run_id
        if rejecting:
            _refuse(run_id, str(exc), as_json)
        _err(str(exc))
        raise typer.Exit(EXIT_FAILED) from None


def _need_journal(run_id: str, where: Any, no_journal: str | None = None, *, rejecting: bool = False,
                  as_json: bool = False) -> None:
    """Exit 1 when ``where`` has no journal (saying ``no_journal``, else that
    the run is unknown), so a command on one existing run creates none.
    ``rejecting``: the command's refusals are rejections (see :func:`_refuse`)."""
    from loopledger.engine._errors import UnknownRun

    if not where.has_journal:
        why = no_journal or str(UnknownRun(run_id))
        if rejecting:
            _refuse(run_id, why, as_json)
        _err(why)
        raise typer.Exit(EXIT_FAILED)


def _known_line(runner: Any, run_id: str) -> dict[str, Any] | None:
    """The run's JSON line, or None when the journal does not know it (a
    token refused before the run was looked up)."""
    from loopledger.engine._errors import UnknownRun

    try:
        return _outcome_json(runner.outcome(run_id))
    except UnknownRun:
        return None


def _refuse(run_id: str, why: str, as_json: bool, line: dict[str, Any] | None = None) -> NoReturn:
    """Exit 1 for a rejected ``reply`` or ``token``: the reason on stderr and,
    with ``--json``, the run's line (``line``, else one for a run the journal
    does not know) with the reason under ``rejected``, so that a script
    reading stdout gets one object whatever happened."""
    import json

    if as_json:
        known = line or {"run_id": run_id, "task_id": None, "status": None, "reason": None}
        typer.echo(json.dumps({**known, "rejected": why}))
    _err(f"rejected: {why}")
    raise typer.Exit(EXIT_FAILED)


def _print_export(result: Any, traces: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    from loopledger._console import console as stdout_console

    console = stdout_console(wide=False)
    if result.export_id is None:
        console.print(f"Nothing new to export; traces in [bold]{escape(str(traces))}[/] are up to date.")
        return
    if result.refilled:
        console.print(f"Written again from the journal (their folders were deleted): {', '.join(result.refilled)}")
    table = Table(title=f"export {result.export_id}: {result.runs} run(s) with new events")
    table.add_column("table")
    table.add_column("rows written", justify="right")
    for name, rows in result.rows.items():
        table.add_row(name, str(rows))
    console.print(table)
    console.print(f"Traces: [bold]{escape(str(traces))}[/]")


@app.command()
@guarded
def export(
    home: HomeOption = None,
    store: StoreOption = None,
    compact: Annotated[bool, typer.Option("--compact", help="Merge each table's segments into one file.")] = False,
    repair: Annotated[bool, typer.Option(
        "--repair", help="Also read every trace file whole and write each unreadable one again from the journal; "
                         "exit 3 if one cannot be.")] = False,
) -> None:
    """Journal → Parquet traces. Idempotent: running it twice adds no rows."""
    from loopledger.engine._recorder import Recorder

    where = _home(home, store)
    if not where.has_journal:
        # Nothing was ever run there (a mistyped --home or --store, say):
        # make nothing. A new, empty journal would claim the folder's
        # traces (imported ones) and lock its own journal out of them.
        typer.echo(f"No journal at {where.journal_file}: nothing to export.")
        return
    run_store = where.open_store()
    left: list[Any] = []
    try:
        recorder = Recorder(run_store, where.traces)
        if repair:
            repaired = recorder.repair()
            _print_export(repaired.export, where.traces)
            _print_repair(repaired)
            left = repaired.left
        else:
            _print_export(recorder.export(), where.traces)
        if compact:
            merged = recorder.compact()
            typer.echo(
                "Compacted: " + (", ".join(f"{t} ({n} files)" for t, n in merged.items()) or "nothing to merge")
            )
    finally:
        run_store.close()
    if left:
        raise typer.Exit(EXIT_INFRA)


def _print_repair(result: Any) -> None:
    """What ``export --repair`` checked and wrote again; each file it could
    not write again on a line of its own (stderr)."""
    typer.echo(f"Checked {result.checked} trace file(s): "
               + (f"written again from the journal: {', '.join(result.rewritten)}" if result.rewritten
                  else "none needed writing again" if not result.left else "none could be written again"))
    for where, why in result.left:
        _err(f"{where}: {why}")


def _drive(runner: Any, scenarios: list[Any], versions: list[str], model: str, concurrency: int,
           show_progress: bool) -> list[tuple[str, Any]]:
    """Create a run per scenario and prompt version, drive them all; return (run_id, scenario)."""
    batch = [(s, v) for v in versions for s in scenarios]
    created = list(zip(runner.create_all(batch, model), (s for s, _ in batch)))
    _drive_ids(runner, [run_id for run_id, _ in created], concurrency, show_progress)
    return created


def _drive_ids(runner: Any, ids: list[str], concurrency: int, show_progress: bool,
               on_settled: Callable[[str], None] | None = None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not show_progress:
        runner.drive_all(ids, concurrency, on_settled=on_settled)
        return
    from loopledger._console import console

    columns = (TextColumn("runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True, console=console(wide=False)) as progress:
        task = progress.add_task("runs", total=len(ids))

        def settled(run_id: str) -> None:
            progress.advance(task)
            if on_settled is not None:
                on_settled(run_id)

        runner.drive_all(ids, concurrency, on_settled=settled)


class _JsonLines:
    """``--json`` output: a run's line is written (and flushed) as soon as
    the run ends or starts waiting, so a process killed later has already
    handed over what it printed (a resume token is shown once); the runs
    never settled are written at the end."""

    def __init__(self, line: Callable[[str], dict[str, Any]]) -> None:
        self.line = line
        self.written: set[str] = set()
        self.closed = False

    def settled(self, run_id: str) -> None:
        import json

        self.written.add(run_id)
        if self.closed:
            return
        try:
            sys.stdout.write(json.dumps(self.line(run_id)) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (``| head``): the runs are the work, the
            # lines only news of it. Drive on; write nowhere.
            self.closed = True
            _stdout_to_nowhere()

    def rest(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            if run_id not in self.written:
                self.settled(run_id)


def _stopped(drive: Any) -> Any:
    """``drive()``; the RunsStopped it raised, if any, to raise after the
    other runs' rows are printed."""
    from loopledger.engine import RunsStopped

    try:
        drive()
    except RunsStopped as exc:
        return exc
    return None


def _outcome_json(outcome: Any) -> dict[str, Any]:
    line: dict[str, Any] = {"run_id": outcome.run_id, "task_id": outcome.task_id, "status": outcome.status,
                            "reason": outcome.reason}
    if outcome.waiting:
        line["waiting"] = outcome.waiting
    if getattr(outcome, "reply_refused", None):
        line["reply_refused"] = outcome.reply_refused
    return line


@app.command()
@guarded
def run(
    paths: Annotated[list[Path], typer.Argument(help="Scenario files, or folders of *.yaml.")],
    prompt_version: Annotated[str, typer.Option(
        "--prompt-version", help="Prompt version to run: a file HOME/prompts/NAME.md, or a bundled one "
                                 "(v1, v2).")] = "v1",
    model: Annotated[str, typer.Option(
        "--model", help="Model route: scripted (the scenario's script), openai:MODEL or anthropic:MODEL "
                        "(the scenario's model: entries are then ignored).")] = "scripted",
    concurrency: ConcurrencyOption = 8,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if an outcome differs from its expect.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run and line.")] = False,
    home: HomeOption = None,
    store: StoreOption = None,
) -> None:
    """Run scenarios through the engine, record them, export the traces."""

    from loopledger.engine._errors import BadInput
    from loopledger.engine._runner import Runner, check_script, check_tools
    from loopledger.engine._scenario import load_scenarios

    from loopledger.engine._prompts import check_prompt_version
    from loopledger.engine._routes import settings_for

    settings_for(model)  # the SDK and the key, before anything is recorded
    where = _home(home, store)
    check_prompt_version(prompt_version, where.prompts)
    scenarios = load_scenarios(paths)
    if not scenarios:
        raise BadInput(" ".join(map(str, paths)), "no scenario (*.yaml) found")
    for scenario in scenarios:
        check_tools(scenario)
        if model == "scripted":
            check_script(scenario, prompt_version)
    runner = Runner(where)
    try:
        created = list(zip(runner.create_all([(s, prompt_version) for s in scenarios], model), scenarios))
        scenario_of = dict(created)

        def line(run_id: str) -> dict[str, Any]:
            outcome = runner.outcome(run_id, scenario_of[run_id])
            out = _outcome_json(outcome)
            if check:
                out["check"] = "ok" if outcome.ok else outcome.mismatches
            return out

        lines = _JsonLines(line) if as_json else None
        stopped = _stopped(lambda: _drive_ids(runner, list(scenario_of), concurrency, show_progress=not as_json,
                                              on_settled=lines.settled if lines else None))
        if lines is not None:
            lines.rest(list(scenario_of))
        outcomes = [runner.outcome(run_id, scenario) for run_id, scenario in created]
    finally:
        runner.close()
    failed = [o for o in outcomes if not o.ok]
    if not as_json:
        table = _runs_table(f"{len(outcomes)} run(s), prompt version {prompt_version}", [o.run_id for o in outcomes],
                            ("status", "reason", "steps", "tool calls") + (("check",) if check else ()))
        for o in outcomes:
            row = [o.run_id, o.status, o.reason or "", str(o.steps), str(o.tool_calls)]
            if check:
                row.append("ok" if o.ok else "; ".join(o.mismatches))
            table.add_row(*plain_cells(*row))
        console = _console()
        console.print(table)
        for o in outcomes:
            if o.reply_refused:
                console.print(plain_cells(f"{o.run_id}: its scenario's scripted reply was refused "
                                          f"({o.reply_refused}); the run waits for a reply")[0])
        _print_tokens(console, outcomes)
    if stopped is not None:
        raise stopped
    if check and failed:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@guarded
def show(run_id: Annotated[str, typer.Argument(help="The run to show.")], home: HomeOption = None,
         store: StoreOption = None,
         as_json: Annotated[bool, typer.Option("--json", help="One JSON object, nothing clipped.")] = False) -> None:
    """Print a run's timeline: states, steps and attempts, candidates,
    decisions, operations and loop diagnosis. RUN_ID may be the start of
    one run's id."""
    from loopledger.engine._show import RunNotFound, TracedRuns, render_run, resolve_run, run_document

    def render_run_json(source: Any, wanted: str) -> None:
        import json

        sys.stdout.write(json.dumps(run_document(source, wanted), ensure_ascii=False, default=str) + "\n")

    render = render_run_json if as_json else render_run

    where = _home(home, store)
    run_store = where.open_store(to_read=True) if where.has_journal else None
    traced = TracedRuns(where.traces)  # an imported run lives in the trace tables only
    try:
        try:
            source, whole = resolve_run(run_id, [s for s in (run_store, traced) if s is not None],
                                        _looked_in(where, run_store is not None))
        except RunNotFound as exc:
            _err(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        render(source, whole)
    finally:
        if run_store is not None:
            run_store.close()


def _looked_in(where: Any, journal: bool) -> str:
    """Where a run was looked for, for the message that says it is not there."""
    if journal:
        return f"neither in the journal nor in {where.traces}"
    return f"not in {where.traces}, and there is no journal ({where.journal_file})"


def _stdout_to_nowhere() -> None:
    """After the reader of stdout went away: what is still written there
    (and Python's flush at exit) goes to /dev/null, not to a broken pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _console() -> Any:
    """Rich's console for tables of runs: a terminal's width, else (a pipe,
    a CI log) wide enough that rows keep to one line."""
    from loopledger._console import console

    return console()


#: What ``runs`` shows of a wait: never the token's hash or the state version it binds.
_WAIT_FIELDS = ("kind", "wait_id", "approval_id", "operation_id", "question", "reason", "expires_at", "work_ids")


@app.command(name="runs")
@guarded
def runs_(
    status: Annotated[list[str] | None, typer.Option(
        "--status", help="Only runs in this state (e.g. WAITING_USER); may be given again.")] = None,
    home: HomeOption = None,
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run and line.")] = False,
) -> None:
    """List the journal's runs, oldest first: state, reason, steps, tool
    calls, and for a run that waits what it waits for and until when (a
    person's wait: its question; its resume token is never shown again,
    `loopledger token RUN` issues a new one)."""
    import json

    from loopledger.engine._clock import from_us
    from loopledger.engine._errors import BadInput
    from loopledger.engine._states import State

    states: list[State] = []
    for given in status or ():
        name = given.strip().upper()
        if name not in State.__members__:
            raise BadInput("--status", f"expected a run state ({', '.join(State.__members__)}), got {given!r}")
        states.append(State[name])
    where = _home(home, store)
    if not where.has_journal:
        records = []
    else:
        journal = where.open_store()
        try:
            records = journal.list_runs(states or None)
        finally:
            journal.close()
    lines = []
    for r in records:
        line: dict[str, Any] = {
            "run_id": r.run_id, "task_id": r.task_id, "status": r.state.value, "reason": r.reason,
            "started_at": from_us(r.started_at).isoformat(),
            "ended_at": from_us(r.ended_at).isoformat() if r.ended_at is not None else None,
            "steps": r.step, "tool_calls": r.tool_calls}
        if r.waiting and not r.state.is_terminal:
            line["waiting"] = {k: r.waiting[k] for k in _WAIT_FIELDS if r.waiting.get(k) is not None}
        lines.append(line)
    if as_json:
        for line in lines:
            typer.echo(json.dumps(line))
        return
    if not lines:
        typer.echo(f"No run{' in state ' + ', '.join(s.value for s in states) if states else ''} "
                   f"({where.describe_journal()}).")
        return
    table = _runs_table(f"{len(lines)} run(s)", [x["run_id"] for x in lines],
                        ("status", "reason", "steps", "tool calls", "started (UTC)", "waiting for"))
    for x in lines:
        wait = x.get("waiting") or {}
        why = f" [{wait['reason']}]" if wait.get("reason") else ""
        what = (f"{wait['kind']}: {wait.get('question') or ', '.join(wait.get('work_ids') or ())}{why} "
                f"(until {wait.get('expires_at') or '-'})" if wait else "")
        table.add_row(*plain_cells(x["run_id"], x["status"], x["reason"] or "", x["steps"], x["tool_calls"],
                                   x["started_at"][:19], what))
    _console().print(table)


def _runs_table(title: str, run_ids: list[str], columns: tuple[str, ...]) -> Any:
    """A table with one row per run: the run id first, never cut or folded
    (it is what show, reply and cancel take, so it must copy whole); the
    other columns fold rather than lose their end when the width is short."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("run_id", no_wrap=True, min_width=max(map(len, run_ids), default=6))
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def _print_tokens(console: Any, outcomes: list[Any]) -> None:
    """The resume tokens of waits that began now, whole, one per line: they
    are shown once and the journal keeps only their hash."""
    waits = [o for o in outcomes if o.waiting and o.waiting.get("resume_token")]
    if not waits:
        return
    console.print("Resume tokens, shown once (loopledger reply RUN_ID --token TOKEN ...):", soft_wrap=True)
    for o in waits:
        console.print(f"  {o.run_id}  {o.waiting['kind']}  expires {o.waiting.get('expires_at') or '-'}",
                      soft_wrap=True)
        console.print(f"    {o.waiting['resume_token']}", soft_wrap=True, highlight=False)


def _print_outcomes(outcomes: list[Any], as_json: bool, title: str) -> None:
    import json

    if as_json:
        for outcome in outcomes:
            typer.echo(json.dumps(_outcome_json(outcome)))
        return
    table = _runs_table(title, [o.run_id for o in outcomes], ("status", "reason", "steps", "waiting"))
    for o in outcomes:
        waiting = f"{o.waiting['kind']} until {o.waiting.get('expires_at') or '-'}" if o.waiting else ""
        table.add_row(*plain_cells(o.run_id, o.status, o.reason or "", o.steps, waiting))
    console = _console()
    console.print(table)
    _print_tokens(console, outcomes)


def _resumed_title(outcomes: list[Any]) -> str:
    """What a resume did: a run found waiting may still wait, which is no resumption."""
    from loopledger.engine._states import TERMINAL, State

    ended = sum(State[o.status] in TERMINAL for o in outcomes)
    waiting = sum(o.status.startswith("WAITING_") for o in outcomes)
    parts = [f"{ended} ended", f"{waiting} still waiting"]
    if rest := len(outcomes) - ended - waiting:
        parts.append(f"{rest} left where they were")
    return f"{len(outcomes)} unfinished run(s): " + ", ".join(parts)


@app.command(short_help="Resume every non-terminal run from its last committed state.")
@guarded
def resume(
    home: HomeOption = None,
    store: StoreOption = None,
    concurrency: ConcurrencyOption = 8,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run and line.")] = False,
) -> None:
    """Resume every non-terminal run from its last committed state. Runs that
    wait for a person or for background work stay waiting unless their event
    arrived or they expired; a resumed run that starts waiting for background
    work is driven on until the work is done, as `run` does."""
    from loopledger.engine._runner import Runner
    from loopledger.engine._states import TERMINAL, State

    where = _home(home, store)
    if not where.has_journal:
        # Nothing was ever run here (a mistyped --home, say): make nothing.
        if not as_json:
            typer.echo(f"No journal in {where.root}: nothing to resume.")
        return
    # A run whose scenario scripts replies gets its next one (the `run` that
    # would have delivered it died): the scenario's script goes on.
    runner = Runner(where, auto_reply=True)
    try:
        records = runner.store.list_runs(s for s in State if s not in TERMINAL)
        ids = [r.run_id for r in records]
        waiting = {r.run_id: r.state_version for r in records if r.state is State.WAITING_TOOL}
        # A run this process cannot drive (its model's key missing here, its
        # tools another data directory's) stays where it is; the others are
        # driven on, and all are printed before the error.
        lines = _JsonLines(lambda run_id: _outcome_json(runner.outcome(run_id))) if as_json else None
        stopped = _stopped(lambda: runner.drive_all(ids, concurrency, leave_waiting=waiting,
                                                    on_settled=lines.settled if lines else None))
        # A run another process was driving meanwhile (a second resume) is
        # that process's to report: its state here would be a moment of it.
        ids = [run_id for run_id in ids if run_id not in runner.held_elsewhere]
        if lines is not None:
            lines.rest(ids)
        outcomes = [runner.outcome(run_id) for run_id in ids]
    finally:
        runner.close()
    if not as_json:
        if outcomes:
            _print_outcomes(outcomes, False, _resumed_title(outcomes))
        elif not runner.held_elsewhere:
            typer.echo(f"No unfinished run in {where.root}: nothing to resume.")
        if runner.held_elsewhere:
            typer.echo(f"{len(runner.held_elsewhere)} run(s) left to another process driving them meanwhile.")
    if stopped is not None:
        raise stopped


@app.command()
@guarded
def reply(
    run_id: Annotated[str, typer.Argument(help="The waiting run (its id, or a unique start of it).")],
    token: Annotated[str, typer.Option("--token", help="The resume token shown when the wait began.")],
    approve: Annotated[bool, typer.Option("--approve", help="Approve the pending operation.")] = False,
    deny: Annotated[bool, typer.Option("--deny", help="Deny the pending operation.")] = False,
    answer: Annotated[str | None, typer.Option("--answer", help="The answer, as JSON.")] = None,
    by: Annotated[str | None, typer.Option("--by", help="Who replies (kept with the reply).")] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (kept with the reply; a denial's reason "
                                                                  "reaches the model).")] = None,
    home: HomeOption = None,
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run and line.")] = False,
) -> None:
    """Deliver a person's reply or approval decision to a waiting run and resume it."""
    from loopledger.engine._errors import BadInput, NotDrivableHere, UnknownRun
    from loopledger.engine._waits import Reply, ReplyRejected

    if sum((approve, deny, answer is not None)) != 1:
        raise BadInput("reply", "give exactly one of --approve, --deny, --answer JSON")
    value: Any = None
    if answer is not None:
        from loopledger.canonical import CanonicalJSONError, canonical_json, strict_loads

        try:
            # NaN, Infinity and 1e999 are not JSON numbers: no journal keeps them.
            value = strict_loads(answer)
        except ValueError as exc:
            why = exc.reason if isinstance(exc, CanonicalJSONError) else exc
            raise BadInput("--answer", f"expected JSON, got {answer!r} ({why})") from None
        except RecursionError:
            raise BadInput("--answer", f"expected JSON that a journal can keep, got {len(answer):,} characters "
                                       "nested too deep to read") from None
        try:
            canonical_json(value)  # what the journal will keep: text every journal can hold
        except CanonicalJSONError as exc:
            raise BadInput("--answer", f"expected JSON that a journal can keep, got {answer!r} ({exc})") from None
    by, reason = _said("--by", by, 200), _said("--reason", reason, 2000)
    where = _home(home, store)
    runner = _runner_for(run_id, where, no_journal=f"wrong run: no run {run_id!r} in the journal "
                                                   f"(there is no journal in {where.root})",
                         rejecting=True, as_json=as_json)
    try:
        run_id = _whole_run_id(run_id, runner.store, rejecting=True, as_json=as_json)
        try:
            view = runner.controller.reply(run_id, token, Reply(approve=True if approve else (False if deny else None),
                                                                answer=value, by=by, note=reason))
        except ReplyRejected as exc:
            # A rejection may have written: an expired wait ends the run, and
            # a reply that lost the race to another keeps its events as late
            # events. The traces get them as the journal has them.
            runner.recorder.flush()
            _refuse(run_id, exc.why, as_json, _known_line(runner, run_id))
        except UnknownRun as exc:
            _refuse(run_id, f"wrong run: {exc}", as_json)
        except NotDrivableHere as exc:
            _refuse(run_id, str(exc), as_json, _known_line(runner, run_id))
        if view.new_token:
            runner.tokens[run_id] = view.new_token
        if runner.controller.load(run_id).state.name == "WAITING_TOOL":
            runner.drive_all([run_id], 1)
        runner.record_scenario_labels(run_id)
        runner.recorder.flush()
        outcome = runner.outcome(run_id)
    finally:
        runner.close()
    _print_outcomes([outcome], as_json, "reply accepted")


@app.command(short_help="Issue a new resume token for a run that waits for a person.")
@guarded
def token(
    run_id: Annotated[str, typer.Argument(help="The waiting run (its id, or a unique start of it).")],
    home: HomeOption = None,
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per run and line.")] = False,
) -> None:
    """Issue a new resume token for a run that waits for a person: for a
    token lost before it was shown (the process died between the commit that
    began the wait and printing it). The earlier token stops working; the
    wait itself (question, schema, expiry) is unchanged. Exit 0, or 1 when
    the run does not wait for a person (a wait past its expiry ends the run
    instead: EXPIRED, or BUDGET_EXHAUSTED when the run's deadline ended it),
    or when its cancellation was requested."""
    from loopledger.engine._errors import NotDrivableHere, UnknownRun
    from loopledger.engine._waits import ReplyRejected

    runner = _runner_for(run_id, _home(home, store), rejecting=True, as_json=as_json)
    try:
        run_id = _whole_run_id(run_id, runner.store, rejecting=True, as_json=as_json)
        try:
            view = runner.controller.reissue_token(run_id)
        except ReplyRejected as exc:
            # As for reply: an expired wait ends the run, and a reissue that
            # lost the race keeps its event as a late event.
            runner.recorder.flush()
            _refuse(run_id, exc.why, as_json, _known_line(runner, run_id))
        except UnknownRun as exc:
            _refuse(run_id, str(exc), as_json)
        except NotDrivableHere as exc:
            _refuse(run_id, str(exc), as_json, _known_line(runner, run_id))
        runner.tokens[run_id] = view.new_token
        runner.recorder.flush()
        outcome = runner.outcome(run_id)
    finally:
        runner.close()
    _print_outcomes([outcome], as_json, "a new resume token")


@app.command()
@guarded
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel (its id, or a unique start of it).")],
    home: HomeOption = None,
    store: StoreOption = None,
) -> None:
    """Request cancellation: pending work is cancelled, then the run ends
    CANCELLED, or CANCEL_UNKNOWN where a backend cannot confirm the stop."""
    from loopledger.engine._errors import NotDrivableHere, Unavailable, UnknownRun
    from loopledger.engine._people import HANDOVER_WAIT_S, record_cancel
    from loopledger.engine._runner import Runner

    where = _home(home, store)
    _need_journal(run_id, where)
    # The request first, through the journal alone: a driver stalled in a
    # send may hold the tool backend this process would open next.
    journal = where.open_store()
    try:
        run_id = _whole_run_id(run_id, journal)
        recorded = record_cancel(journal, run_id)
    except UnknownRun as exc:
        _err(str(exc))
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        journal.close()
    try:
        runner = Runner(where, auto_reply=False, signs=False)  # a cancel signs nothing
    except Unavailable as exc:
        if recorded != "recorded":
            raise
        typer.echo(f"{run_id}: cancellation requested; the process that holds the run carries it out "
                   f"({exc})")
        return
    try:
        if recorded != "recorded":
            # Ended, or its wait ran out first: it ends as that says (a
            # drive ends an expired wait), and the cancel came too late.
            if recorded == "wait over":
                runner.controller.drive(run_id, wait_s=HANDOVER_WAIT_S)
            runner.recorder.flush()  # a request that met the end is kept as a late event: the traces get it
            record = runner.store.get_run(run_id)
            _err(f"run {run_id} already ended: {record.state.value} ({record.reason})")
            raise typer.Exit(EXIT_FAILED)
        # A process driving the run meets the request at its next commit and
        # cancels the run itself; this one waits for it to let go.
        try:
            view = runner.controller.drive(run_id, wait_s=HANDOVER_WAIT_S)
        except NotDrivableHere as exc:
            # The request is recorded: whoever can drive the run cancels it.
            runner.recorder.flush()  # the request is in the journal: the traces get it too
            typer.echo(f"{run_id}: cancellation requested; it takes effect where the run can be driven "
                       f"({exc.why})")
            return
        runner.recorder.flush()
        reason = runner.store.get_run(run_id).reason
    finally:
        runner.close()
    from loopledger.engine._states import TERMINAL

    if view.state not in TERMINAL:
        # Another process holds the run (it drives it, or created it and
        # has not started it): it meets the request at its next commit.
        typer.echo(f"{run_id}: cancellation requested; the process that holds the run carries it out "
                   f"(now {view.state.value})")
        return
    if view.state.value not in ("CANCELLED", "CANCEL_UNKNOWN"):
        # It was past cancelling (FINALIZING: its outcome was decided and
        # committed) and ended as decided: as for a run already ended, exit 1.
        _err(f"run {run_id} ended {view.state.value} ({reason}) before the cancellation could take effect")
        raise typer.Exit(EXIT_FAILED)
    typer.echo(f"{run_id}: {view.state.value} ({reason})")


@app.command()
@guarded
def demo(
    home: HomeOption = None,
    store: StoreOption = None,
    concurrency: ConcurrencyOption = 8,
) -> None:
    """The main job on the embedded default: the bundled scenarios under
    prompt versions v1 and v2, recorded, exported and compared."""
    from rich.markup import escape

    from loopledger._console import console as stdout_console
    from loopledger.engine._runner import Runner, check_script, check_tools
    from loopledger.engine._scenario import bundled_folder, load_scenarios
    from loopledger.engine._show import comparison_table

    console = stdout_console(wide=False)
    where = _home(home, store)
    scenarios = load_scenarios([bundled_folder()])
    for scenario in scenarios:
        check_tools(scenario)
        for version in ("v1", "v2"):
            check_script(scenario, version)
    console.print(f"Running {len(scenarios)} bundled scenarios under prompt versions v1 and v2 "
                  f"(scripted model, {where.describe_journal()}) ...")
    runner = Runner(where)
    try:
        created = _drive(runner, scenarios, ["v1", "v2"], "scripted", concurrency, show_progress=True)
        outcomes = [runner.outcome(run_id, scenario) for run_id, scenario in created]
    finally:
        runner.close()
    console.print(comparison_table(outcomes))
    mismatched = [o for o in outcomes if not o.ok]
    console.print(f"{len(outcomes) - len(mismatched)} of {len(outcomes)} runs ended as their scenario expects.")
    console.print(f"Traces: {where.traces}")
    example = next((o.run_id for o in outcomes if o.status != "SUCCEEDED"), outcomes[0].run_id if outcomes else "RUN_ID")
    console.print(f"Inspect one run:  [bold]loopledger show {escape(example)} {escape(where.options())}[/]",
                  soft_wrap=True)
    _demo_replay(console, where, made=len(outcomes))


def _demo_replay(console: Any, where: Any, made: int) -> None:
    """Replay the demo runs under the bundled default and strict suites and print the flips."""
    from rich.markup import escape

    from loopledger.engine._postgres import redact
    from loopledger.replay import replay_many
    from loopledger.replay._report import flip_groups

    results = replay_many(where.traces, ["default", "strict"], write_to=where.replays)
    for name, result in results.items():
        s = result.summary
        console.print(f"Replay with suite [bold]{name}[/] ({s.replay_id}): {s.candidates} candidates, "
                      f"{s.flips} flip(s) against the recorded decisions, {s.runs_diverged} run(s) diverged, "
                      f"{s.regressions} regression(s)")
        for (validator, old, new, _, _), kinds in flip_groups(result.diffs):
            console.print(escape(f"  {validator}: {old} -> {new} x{sum(kinds.values())}"))
    replayed = next(iter(results.values())).summary.runs
    if replayed > made:
        # A replay reads the whole traces folder: say so when it holds more
        # than this demo made, so the figures are not taken for the demo's.
        if where.store_url is not None:
            # A journal named by --store may be shared: its other runs are exported here too.
            how = "give --home an empty folder and --store a journal of its own to see the demo alone"
        else:
            how = "give --home an empty folder to see the demo alone"
        console.print(f"(these replays cover every run in the traces folder: {replayed:,}, of which "
                      f"{replayed - made:,} were not made by this demo; {how})")
    console.print(f"Open the workbench:  [bold]loopledger ui {escape(where.options())}[/]", soft_wrap=True)
    if where.store_url is not None and redact(where.store_url) != where.store_url:
        console.print("(the --store URL above has its password masked: give yours in its place)")


@app.command("replay")
@guarded
def replay_cmd(
    suite: Annotated[str, typer.Option("--suite", help="Bundled suite name, a suite .yaml file, or pkg.module:attr.")],
    baseline: Annotated[str, typer.Option("--baseline", help="'recorded' or an earlier REPLAY_ID.")] = "recorded",
    traces: Annotated[Path | None, typer.Option("--traces", help="Trace directory (default: HOME/traces).")] = None,
    fail_on: Annotated[str, typer.Option("--fail-on", help="flips | regressions | never.")] = "regressions",
    junit: Annotated[Path | None, typer.Option("--junit", help="Write a JUnit XML report here.")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Write a Markdown report here.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Processes (default: auto).")] = None,
    home: HomeOption = None,
) -> None:
    """Re-run a suite's validators, loop detectors and completion gate over
    every recorded candidate, without any model call; compare with the
    baseline. Exit 0 pass, 1 failures under --fail-on, 2 bad input, 3 a
    worker process lost (nothing written)."""
    from loopledger.replay import ReplayInputError, WorkerLost
    from loopledger.replay._commands import replay_command

    # A CI job cancelled, a `timeout`: SIGTERM unwinds the replay as an
    # interrupt does, so nothing unfinished (``<id>.partial``, its work
    # folder) is left behind.
    _terminate_by_unwinding()
    try:
        code = replay_command(home=_home(home, command="replay"), suite=suite, baseline=baseline, traces=traces,
                              fail_on=fail_on, junit=junit, markdown=markdown, workers=workers)
    except ReplayInputError as exc:
        _err(f"bad input: {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except WorkerLost as exc:
        # Not the input, and not a verdict on the suite: the machine's.
        _err(str(exc))
        raise typer.Exit(EXIT_INFRA) from None
    raise typer.Exit(code)


@app.command(short_help="Add a label: what a decision should have been.")
@guarded
def label(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    step: Annotated[int, typer.Option("--step", min=1, help="Step of the candidate.")],
    expect: Annotated[str, typer.Option("--expect", help="The verdict it should have had: accept | repair | ask | reject.")],
    attempt: Annotated[int, typer.Option("--attempt", min=1, help="Attempt of the candidate.")] = 1,
    validator: Annotated[str, typer.Option("--validator", help="Validator; empty: the candidate as a whole.")] = "",
    note: Annotated[str, typer.Option("--note", help="Why.")] = "",
    source: Annotated[str, typer.Option("--source", help="human | import | scenario.")] = "human",
    suite: Annotated[str | None, typer.Option("--suite", help=(
        "A suite whose validators --validator may name besides those recorded and registered (its imports "
        "are loaded): a validator a replay will run, not yet in the traces."))] = None,
    home: HomeOption = None,
    store: StoreOption = None,
) -> None:
    """Add a label (what a decision should have been) and export it to the
    traces; replays then call diffs that agree or disagree with it fixes or
    regressions. RUN_ID may be the start of one run's id."""
    from loopledger.replay import ReplayInputError
    from loopledger.replay._commands import label_command

    try:
        added = label_command(home=_home(home, store), run_id=run_id, step=step, attempt=attempt,
                              validator=validator, expect=expect, note=note, source=source, suite=suite)
    except ReplayInputError as exc:
        _err(f"bad input: {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    who = added["validator"] or "the candidate as a whole"
    typer.echo(f"label {added['label_id']}: {added['run_id']} step {step} attempt {attempt} ({who}) "
               f"should be {expect} [{source}]")


@app.command()
@guarded
def ui(
    home: HomeOption = None,
    store: StoreOption = None,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port on 127.0.0.1.")] = 8501,
) -> None:
    """Serve the Streamlit workbench on 127.0.0.1 over HOME's traces and replays."""
    from importlib import resources

    from loopledger.engine._errors import BadInput

    where = _home(home, store)
    root = where.root.resolve()
    script = Path(str(resources.files("loopledger.ui").joinpath("app.py")))
    if not _port_free(port):
        raise BadInput("--port", f"127.0.0.1:{port} is already in use; expected a free port")
    typer.echo(f"loopledger workbench on http://127.0.0.1:{port}  (data: {root}; Ctrl-C stops it)")
    # The app reads the data directory from the environment: Streamlit's own
    # argument parser would otherwise claim --home. The journal (--store) is
    # where the labels given in the workbench are written.
    env = {**os.environ, "LOOPLEDGER_HOME": str(root)}
    env.pop("LOOPLEDGER_STORE", None)
    if where.store_url is not None:
        env["LOOPLEDGER_STORE"] = where.store_url
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.address", "127.0.0.1",
           "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    sys.stdout.flush()
    # Become the server rather than wrap it: signals (Ctrl-C, a supervisor's
    # SIGTERM) then reach Streamlit itself and no orphan is left behind.
    os.execve(sys.executable, cmd, env)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@app.command("import", short_help="Convert external agent traces into the trace tables.")
@guarded
def import_cmd(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help="tau-bench | tau2 | openai-jsonl | toolbench.")],
    paths: Annotated[list[Path], typer.Argument(metavar="PATH...", help="Files, or folders searched for them.")],
    tools: Annotated[Path | None, typer.Option("--tools", help=(
        "Tool catalogue for every file: a JSON list of OpenAI tools, or {\"tools\": [...], \"tool_types\": "
        "{...}} (docs/importers.md)."))] = None,
    decide: Annotated[str | None, typer.Option(
        "--decide", help="Also record this suite's decisions, computed at import, as the runs' baseline.")] = None,
    home: HomeOption = None,
) -> None:
    """Convert external agent traces into the trace tables: one run per
    conversation, a candidate per assistant message, an operation per tool
    call, the reward as a column and as import labels. Exit 0 done, 2 bad
    input (file, record and reason; nothing written)."""
    from loopledger.datasets import ImportInputError, import_traces

    where = _home(home, command="import")
    try:
        result = import_traces(fmt, paths, home=where.root, tools=tools, decide=decide)
    except ImportInputError as exc:
        # An argument's error names it as Python spells it: here, the option.
        option = {"fmt": "FORMAT", "tools": "--tools", "decide": "--decide"}.get(getattr(exc, "argument", ""))
        if option is None:
            raise
        raise ImportInputError(option, exc.record, exc.reason) from None
    lines = []
    for f in result.files:
        invalid = f", {f.invalid} marked not valid by the source" if f.invalid else ""
        twice = f.skipped - f.recorded
        skipped = ", ".join([f"{f.recorded} already imported"] + ([f"{twice} given twice"] if twice else []))
        lines.append(f"{f.path}: {f.runs} runs ({skipped}{invalid}), {f.candidates} candidates, "
                     f"{f.operations} tool calls ({f.failed_operations} failed"
                     + (f", {f.unanswered_operations} without a result" if f.unanswered_operations else "")
                     + f"), {f.user_tool_calls} user tool calls"
                     + (f", {f.unmatched_results} tool results answering no call (kept as messages)"
                        if f.unmatched_results else ""))
    already = sum(f.recorded for f in result.files)  # imported before; those given twice were imported once now
    if decide is not None and already:
        # Runs already imported keep what they were imported with: a second
        # suite's decisions beside the first would be two baselines in one.
        lines.append(f"--decide {decide}: recorded for the runs imported now; runs skipped as already imported keep "
                     "the decisions they were imported with (none without --decide); to judge them under another "
                     "suite, replay it and compare with --baseline REPLAY_ID")
    # With no run in the files nor before them, there is nothing to replay yet.
    following = (f"next: loopledger replay --suite {shlex.quote(decide or 'default')} {where.options()}"
                 if result.runs or already else "these files hold no run")
    lines.append(f"imported {result.runs} runs into {where.root} ({result.skipped} skipped); {following}")
    try:
        for line in lines:
            typer.echo(line)
    except BrokenPipeError:
        # The reader went away (``| head``) after the runs were imported: the
        # import is done (exit 0); what is left of its report goes nowhere.
        _stdout_to_nowhere()


class Terminated(BaseException):
    """SIGTERM, where a command unwinds on it (see :func:`_terminate_by_unwinding`)."""


#: The signal that ended the command (SIGINT, SIGTERM), where it unwinds on
#: one: DuckDB turns the exception a signal raises inside a query into its
#: own "interrupted" error, and this says which signal it was.
_SIGNALLED: list[int] = []


def _terminate_by_unwinding() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread, so that a
    command's cleanup runs (the default ends the process where it stands).
    Only for commands whose work is all in the main thread and its child
    processes: the engine's commands keep SIGTERM's default, a crash the
    journal is made to survive."""
    import signal

    _SIGNALLED.clear()  # a command run before in this process says nothing of this one

    def terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it at once
        _SIGNALLED.append(signum)
        raise Terminated()

    def interrupted(signum: int, frame: Any) -> None:
        _SIGNALLED.append(signum)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGTERM, terminated)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted)


def _interrupted_query(exc: BaseException) -> bool:
    """DuckDB's error for a query a signal interrupted (``Terminated`` or
    ``KeyboardInterrupt`` raised inside it comes out as this)."""
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    return bool(_SIGNALLED) and ("InterruptException" in kinds or "Query interrupted" in str(exc))


def _command_names() -> set[str]:
    import typer.main

    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def main() -> None:
    if os.environ.get("OTEL_TRACES_EXPORTER"):
        # Spans of the runs this process drives (docs/engine.md); read only
        # when asked for: the SDK is not imported otherwise.
        from loopledger.engine._errors import BadInput
        from loopledger.engine._otel import configure_from_env

        try:
            configure_from_env()
        except BadInput as exc:
            _err(f"bad input: {exc}")
            sys.exit(EXIT_BAD_INPUT)
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt:
        _err("interrupted")
        sys.exit(130)
    except Terminated:
        _err("terminated")
        sys.exit(143)
    except BrokenPipeError:
        # The reader went away (``| head``) before the command finished
        # printing: what it recorded stands; it ends as a command killed by
        # SIGPIPE does in a shell (141), not with a code that means something
        # else here (1: an unknown run, a failed check).
        _stdout_to_nowhere()
        sys.exit(141)
    except Exception as exc:
        import signal

        if _interrupted_query(exc):
            terminated = _SIGNALLED[0] == signal.SIGTERM
            _err("terminated" if terminated else "interrupted")
            sys.exit(143 if terminated else 130)
        # click's exceptions, known by name: newer typer versions bundle
        # their own copy of click, older ones use the click package.
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "NoArgsIsHelpError" in kinds:
            typer.echo(exc.ctx.get_help())  # type: ignore[attr-defined]
            sys.exit(EXIT_BAD_INPUT)
        if "UsageError" in kinds:
            # One line, like every other bad input: click's message names
            # the option or argument and what was expected.
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else "loopledger"
            if command == "loopledger":
                # An option missing its value is reported before the
                # command's context exists: the command is still the one typed.
                names = _command_names()
                typed = next((arg for arg in sys.argv[1:] if arg in names), None)
                command += f" {typed}" if typed else ""
            _err(f"bad input: {exc.format_message()} (see {command} --help)")  # type: ignore[attr-defined]
            sys.exit(EXIT_BAD_INPUT)
        if "ClickException" in kinds:
            _err(exc.format_message())  # type: ignore[attr-defined]
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        if "Abort" in kinds:
            _err("interrupted")
            sys.exit(130)
        raise
    if code == 130:
        # typer turns a KeyboardInterrupt it meets into exit 130, silently.
        _err("interrupted")
    sys.exit(code if isinstance(code, int) else EXIT_OK)
