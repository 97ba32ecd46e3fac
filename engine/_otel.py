"""OpenTelemetry spans of the runs this process drives (the ``otel`` extra).

loopledger is instrumented the way a library is: it uses ``opentelemetry-api``
and sends its spans to the tracer provider the application set up. Without
one (or without the extra) nothing is made: each drive asks once whether a
provider is there. The command line sets one up when ``OTEL_TRACES_EXPORTER``
names an exporter (:func:`configure_from_env`): ``console`` (each span as
JSON on stderr) or ``otlp`` (HTTP, to ``OTEL_EXPORTER_OTLP_ENDPOINT``); a
provider set up before (``opentelemetry-instrument loopledger ...``) is kept.

The spans::

    loopledger.drive       one per drive of a run by this process: from taking
                           it up to letting it go (it ended, it waits, another
                           process holds it); attributes: the run, the state
                           and reason it was left in, the transitions made
      loopledger.<STATE>   one per state the loop handles (READY, MODEL_RUNNING,
                           VALIDATING, ...), with the step and attempt; a
                           state entered by a held move (docs/engine.md) is
                           handled within the span of the one before it

Every span of a run is in one trace, whose id (and its parent span's) is
derived from the run id: the drives of one run by several processes (a
crash and a resume, a reply hours later) line up in one trace. That parent
span is never sent itself (no process sees the whole run), so a trace
viewer shows the drives under a parent it has no record of.

The journal stays the record: a span is made after the fact of what was
committed and is lost with its process, as telemetry is.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from importlib.util import find_spec
from typing import Any

from ._errors import BadInput

EXPORTERS = ("console", "otlp", "none")
_INSTALLED = find_spec("opentelemetry") is not None and find_spec("opentelemetry.trace") is not None


def _tracer() -> Any:
    """The tracer, when an application set up a provider; else None."""
    if not _INSTALLED:
        return None
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # the API's default: no provider, so no span is recorded
    return trace.get_tracer("loopledger")


def run_trace_ids(run_id: str) -> tuple[int, int]:
    """The trace id of a run's spans and the id of the parent of its drives."""
    digest = hashlib.sha256(f"loopledger-run:{run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


class Spans:
    """The spans of one drive (no-ops when no provider is set up)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._drive: Any = None

    @contextmanager
    def drive(self, view: Any, task_id: str) -> Iterator[None]:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

        trace_id, parent_id = run_trace_ids(view.run_id)
        parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
            trace_id, parent_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        with self._tracer.start_as_current_span("loopledger.drive", context=parent, attributes={
            "loopledger.run_id": view.run_id, "loopledger.task_id": task_id,
            "loopledger.tenant": view.tenant, "loopledger.prompt_version": view.prompt_version,
            "loopledger.from_state": view.state.value, "loopledger.from_state_version": view.state_version,
        }) as span:
            self._drive = span
            try:
                yield
            finally:
                self._drive = None

    def left(self, view: Any) -> None:
        """Where the drive left the run: its state (and the reason it ended
        with) and state version."""
        if self._drive is not None:
            self._drive.set_attributes({"loopledger.state": view.state.value,
                                        "loopledger.reason": (view.finalizing or {}).get("reason") or "",
                                        "loopledger.state_version": view.state_version})

    def state(self, view: Any) -> Any:
        # A lost compare-and-set raised in it is the loop's control flow (a
        # reply, a cancel, another worker moved the run), not an error; a
        # real error ends the drive's span, which records it.
        return self._tracer.start_as_current_span(f"loopledger.{view.state.value}", record_exception=False,
                                                  set_status_on_exception=False, attributes={
            "loopledger.run_id": view.run_id, "loopledger.step": view.step, "loopledger.attempt": view.attempt,
            "loopledger.state_version": view.state_version,
        })


class _Off:
    """What a drive uses when no provider is set up: nothing at all."""

    def drive(self, view: Any, task_id: str) -> Any:
        return nullcontext()

    def left(self, view: Any) -> None:
        pass

    def state(self, view: Any) -> Any:
        return nullcontext()


OFF = _Off()


def spans() -> Spans | _Off:
    tracer = _tracer()
    return OFF if tracer is None else Spans(tracer)


def configure_from_env() -> None:
    """Set up a tracer provider from ``OTEL_TRACES_EXPORTER`` (unset or
    ``none``: nothing). A provider already set up is kept. Spans are
    exported in batches and flushed when the process exits."""
    given = os.environ.get("OTEL_TRACES_EXPORTER", "")
    names = [n.strip().lower() for n in given.split(",") if n.strip() and n.strip().lower() != "none"]
    if not names:
        return
    if _INSTALLED:
        from opentelemetry import trace

        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return  # set up already (opentelemetry-instrument, whose exporter names are its own)
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise BadInput("OTEL_TRACES_EXPORTER", f"expected {', '.join(EXPORTERS)} or a list of them, got {given!r}")
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise BadInput("OTEL_TRACES_EXPORTER", f"{given!r} needs the otel extra: pip install 'loopledger[otel]'") \
            from None
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                                        or "loopledger"}))
    for name in dict.fromkeys(names):
        if name == "console":
            exporter: Any = ConsoleSpanExporter(out=sys.stderr)
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise BadInput("OTEL_TRACES_EXPORTER", "'otlp' needs the OTLP exporter: pip install "
                                                       "'loopledger[otel]'") from None
            exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # its shutdown at exit flushes what is left
