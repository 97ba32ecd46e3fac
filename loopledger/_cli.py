"""The ``loopledger`` command line.

Exit codes (CONTRACT.md): 0 done; 1 a check or a request failed; 2 bad
input, named by file, field and reason; 3 infrastructure failure (the
journal or the disk). Heavy libraries (pyarrow, duckdb, polars, streamlit)
are imported inside the commands that need them, so ``--help`` is instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INFRA = 0, 1, 2, 3

app = typer.Typer(
    name="loopledger",
    help="A durable agent loop as a persisted state machine, with offline replay of its decisions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", help="Data directory (default: $LOOPLEDGER_HOME, else ./loopledger-data)."),
]
StoreOption = Annotated[
    str | None, typer.Option("--store", help="Journal URL (default: the SQLite journal in --home).")
]

F = TypeVar("F", bound=Callable[..., Any])


def _err(message: str) -> None:
    typer.echo(f"loopledger: {message}", err=True)


def guarded(fn: F) -> F:
    """Turn the engine's typed errors into one clear line and an exit code,
    never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from loopledger.engine._errors import BadInput, JournalError, LoopLedgerError

        try:
            return fn(*args, **kwargs)
        except BadInput as exc:
            _err(f"bad input: {exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except JournalError as exc:
            _err(f"journal: {exc}")
            raise typer.Exit(EXIT_INFRA) from None
        except LoopLedgerError as exc:
            _err(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except OSError as exc:
            _err(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
            raise typer.Exit(EXIT_INFRA) from None

    return wrapper  # type: ignore[return-value]


def _home(home: Path | None, store: str | None = None) -> Any:
    from loopledger.engine._home import Home

    return Home.resolve(home, store)


def _print_export(result: Any, traces: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if result.export_id is None:
        console.print(f"Nothing new to export; traces in [bold]{traces}[/] are up to date.")
        return
    table = Table(title=f"export {result.export_id}: {result.runs} run(s) with new events")
    table.add_column("table")
    table.add_column("rows written", justify="right")
    for name, rows in result.rows.items():
        table.add_row(name, str(rows))
    console.print(table)
    console.print(f"Traces: [bold]{traces}[/]")


@app.command()
@guarded
def export(
    home: HomeOption = None,
    store: StoreOption = None,
    compact: Annotated[bool, typer.Option("--compact", help="Merge each table's segments into one file.")] = False,
) -> None:
    """Journal → Parquet traces. Idempotent: running it twice adds no rows."""
    from loopledger.engine._recorder import Recorder

    where = _home(home, store)
    run_store = where.open_store()
    try:
        recorder = Recorder(run_store, where.traces)
        result = recorder.export()
        _print_export(result, where.traces)
        if compact:
            merged = recorder.compact()
            typer.echo(
                "Compacted: " + (", ".join(f"{t} ({n} files)" for t, n in merged.items()) or "nothing to merge")
            )
    finally:
        run_store.close()


@app.command()
@guarded
def demo(home: HomeOption = None, store: StoreOption = None) -> None:
    """The main job on the embedded default, as far as it is built."""
    from rich.console import Console

    from loopledger.engine._recorder import Recorder

    console = Console()
    where = _home(home, store)
    run_store = where.open_store()
    try:
        console.print(f"Journal: [bold]{where.journal_path}[/] (schema version {run_store.schema_version})")
        console.print(f"Runs recorded so far: {len(run_store.list_runs())}")
        result = Recorder(run_store, where.traces).export()
        _print_export(result, where.traces)
    finally:
        run_store.close()
    console.print(
        "This build has the journal and the recorder; the loop that runs the bundled "
        "scenarios is not built yet, so the demo created (or opened) the journal and "
        "exported its traces, and ran no agent."
    )


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        _err("interrupted")
        sys.exit(130)
