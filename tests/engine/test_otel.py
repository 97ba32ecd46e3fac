"""OpenTelemetry spans of the runs a process drives (the ``otel`` extra),
through the command line's ``OTEL_TRACES_EXPORTER=console``: a drive span
per run and process, a span per state handled, and one trace per run
whatever the processes that drove it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from loopledger.engine._otel import run_trace_ids  # noqa: E402

CLI = [sys.executable, "-c", "from loopledger._cli import main; main()"]
SCENARIOS = Path(__file__).resolve().parents[2] / "datasets" / "scenarios"


def cli(*args: str, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPLEDGER_", "OTEL_"))}
    return subprocess.run([*CLI, *args, "--home", str(home)], capture_output=True, text=True, timeout=120,
                          env={**merged, **env})


def spans(stderr: str) -> list[dict[str, Any]]:
    """The console exporter's spans: JSON objects one after the other."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := stderr.find("{", at)) != -1:
        span, at = decoder.raw_decode(stderr, at)
        found.append(span)
    return found


def test_a_run_is_one_drive_span_with_a_span_per_state_in_the_runs_own_trace(tmp_path: Path) -> None:
    done = cli("run", str(SCENARIOS / "happy-refund.yaml"), "--json", home=tmp_path / "home",
               env={"OTEL_TRACES_EXPORTER": "console"})
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    found = spans(done.stderr)
    (drive,) = [s for s in found if s["name"] == "loopledger.drive"]
    trace_id, parent_id = run_trace_ids(run_id)
    assert drive["context"]["trace_id"] == f"0x{trace_id:032x}" and drive["parent_id"] == f"0x{parent_id:016x}"
    attrs = drive["attributes"]
    assert (attrs["loopledger.run_id"], attrs["loopledger.task_id"], attrs["loopledger.state"],
            attrs["loopledger.reason"], attrs["loopledger.from_state"]) == (
        run_id, "happy-refund", "SUCCEEDED", "completed", "READY")
    states = [s for s in found if s is not drive]
    # A state the loop handles with the one before it (a held move) has no span of its own.
    assert {s["name"] for s in states} >= {f"loopledger.{name}" for name in (
        "READY", "MODEL_RUNNING", "VALIDATING", "FINALIZING")}
    assert all(s["parent_id"] == drive["context"]["span_id"] for s in states)
    assert all(s["context"]["trace_id"] == drive["context"]["trace_id"] for s in states)
    assert all(s["attributes"]["loopledger.run_id"] == run_id for s in states)
    assert [s["attributes"]["loopledger.state_version"] for s in states] == sorted(
        s["attributes"]["loopledger.state_version"] for s in states)


def test_the_drives_of_a_crashed_and_resumed_run_are_one_trace(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"OTEL_TRACES_EXPORTER": "console"}
    died = cli("run", str(SCENARIOS / "happy-refund.yaml"), "--json", home=home,
               env={**env, "LOOPLEDGER_CRASH_AFTER_COMMITS": "3"})
    assert died.returncode == -9
    resumed = cli("resume", "--json", home=home, env=env)
    assert resumed.returncode == 0, resumed.stderr
    run_id = json.loads(resumed.stdout)["run_id"]
    (drive,) = [s for s in spans(resumed.stderr) if s["name"] == "loopledger.drive"]
    trace_id, _ = run_trace_ids(run_id)
    assert drive["context"]["trace_id"] == f"0x{trace_id:032x}"
    assert drive["attributes"]["loopledger.from_state_version"] > 1  # it took the run up where the crash left it
    assert drive["attributes"]["loopledger.state"] == "SUCCEEDED"


def test_no_exporter_asked_for_is_no_span_and_a_wrong_one_is_bad_input(tmp_path: Path) -> None:
    quiet = cli("run", str(SCENARIOS / "happy-refund.yaml"), "--json", home=tmp_path / "a", env={})
    assert quiet.returncode == 0 and quiet.stderr == ""
    wrong = cli("run", str(SCENARIOS / "happy-refund.yaml"), home=tmp_path / "b",
                env={"OTEL_TRACES_EXPORTER": "jaeger"})
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == ("loopledger: bad input: OTEL_TRACES_EXPORTER: expected console, otlp, none or a "
                                    "list of them, got 'jaeger'")
    assert not (tmp_path / "b").exists()


def test_a_provider_set_up_before_is_kept_whatever_the_exporter_names() -> None:
    """``opentelemetry-instrument`` reads OTEL_TRACES_EXPORTER too, with
    names of its own (otlp_proto_http, lists): the provider it set up is
    used, and its names are not loopledger's to refuse."""
    code = ("import os\n"
            "from opentelemetry import trace\n"
            "from opentelemetry.sdk.trace import TracerProvider\n"
            "from loopledger.engine._otel import configure_from_env\n"
            "mine = TracerProvider()\n"
            "trace.set_tracer_provider(mine)\n"
            "for value in ('otlp_proto_http', 'console,otlp', 'zipkin_json'):\n"
            "    os.environ['OTEL_TRACES_EXPORTER'] = value\n"
            "    configure_from_env()\n"
            "    assert trace.get_tracer_provider() is mine\n"
            "print('kept')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "kept", done.stderr


def test_a_lost_compare_and_set_is_no_error_on_its_state_span_and_a_real_error_ends_the_drive_as_one() -> None:
    """A reply, a cancel or another worker moving the run raises a
    StaleStateVersion inside a state's span: the loop's control flow, not an
    error. An error that ends the drive is recorded on the drive's span."""
    from types import SimpleNamespace

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from loopledger.engine._errors import StaleStateVersion
    from loopledger.engine._otel import Spans
    from loopledger.engine._states import State

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = Spans(provider.get_tracer("test"))
    view = SimpleNamespace(run_id="r1", tenant="acme", prompt_version="v1", state=State.READY, state_version=3,
                           step=1, attempt=1, finalizing=None)
    with pytest.raises(RuntimeError):
        with spans.drive(view, "task"):
            try:
                with spans.state(view):
                    raise StaleStateVersion("r1", 3, 4)
            except StaleStateVersion:
                pass
            raise RuntimeError("a bug")
    state, drive = exporter.get_finished_spans()
    assert (state.name, state.status.status_code, state.events) == ("loopledger.READY", StatusCode.UNSET, ())
    assert drive.name == "loopledger.drive" and drive.status.status_code is StatusCode.ERROR
    assert [e.name for e in drive.events] == ["exception"]
