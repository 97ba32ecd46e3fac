"""A provider on 127.0.0.1 for the model adapter tests, and a scenario run
through ``loopledger run --model ROUTE`` against it.

:class:`ProviderServer` answers each POST with the next scripted
:class:`Reply`: a Server-Sent Events stream written as chunked HTTP/1.1
(``cut=True`` closes the connection before the terminating chunk, the way a
dropped connection looks to a client), or an error status with a JSON body.
It records every request body, so a test can check what the SDK sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from loopledger._cli import app
from loopledger.engine._home import Home


@dataclass
class Reply:
    status: int = 200
    frames: list[bytes] = field(default_factory=list)  # SSE frames, one chunk each
    body: Any = None  # a JSON body for an error status
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


class ProviderServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                server.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                server.paths.append(self.path)
                reply = server.replies.popleft() if server.replies else Reply(
                    500, body={"error": {"message": "the test script has no reply left", "type": "api_error"}})
                if reply.status != 200 or not reply.frames:
                    payload = json.dumps(reply.body or {}).encode()
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for frame in reply.frames:
                    self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                    self.wfile.flush()
                if reply.cut:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(b"0\r\n\r\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


#: Look up one order: the candidate needs a tool call, the gate its evidence.
SCENARIO = {
    "id": "lookup",
    "tenant": "acme",
    "contract": {"goal": "Look up order ORD-1042 and report its status.", "required_evidence": ["order_found"],
                 "allowed_tools": ["orders.get_order"]},
    "budgets": {"max_steps": 6, "max_tool_calls": 4, "deadline_s": 30},
    # Ignored with a real model: were it played, the run would look up ORD-1001.
    "model": [{"tool_calls": [{"name": "orders.get_order", "arguments": {"order_id": "ORD-1001"}}]},
              {"final": "ORD-1001 is paid."}],
}


@dataclass
class Recorded:
    """One run's outcome and journal, as the engine recorded it."""

    exit_code: int
    output: str
    run: Any
    candidates: list[dict[str, Any]]
    bodies: list[dict[str, Any]]  # candidate artifacts, by attempt order
    events: list[Any]
    operations: list[dict[str, Any]]

    def transitions(self) -> list[tuple[str, str, int, int]]:
        return [(e.from_state, e.to_state, e.step, e.attempt) for e in self.events if e.kind == "transition"]


def run_scenario(tmp_path: Path, route: str, env: dict[str, str], scenario: dict[str, Any] | None = None,
                 extra: tuple[str, ...] = ()) -> Recorded:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario or SCENARIO))
    home = tmp_path / "home"
    result = CliRunner().invoke(app, ["run", str(path), "--model", route, "--home", str(home), "--json",
                                      "--concurrency", "1", *extra], env=env)
    store = Home.resolve(home, None).open_store()
    try:
        runs = store.list_runs()
        if not runs:
            return Recorded(result.exit_code, result.output, None, [], [], [], [])
        run = runs[0]
        candidates = sorted(store.facts("candidates", run.run_id), key=lambda r: (r["step"], r["attempt"]))
        bodies = [store.get_artifact(c["candidate_id"]) for c in candidates]
        return Recorded(result.exit_code, result.output, run, candidates, bodies,
                        list(store.events(run.run_id)), store.operations(run.run_id))
    finally:
        store.close()


def files_holding(folder: Path, text: str) -> list[Path]:
    """The files under ``folder`` whose bytes hold ``text`` (a secret that must be stored nowhere)."""
    return [path for path in folder.rglob("*") if path.is_file() and text.encode() in path.read_bytes()]


def items(value: Any) -> list[dict[str, Any]]:
    return json.loads(value) if isinstance(value, str) else value


def paced(server: ProviderServer, reply: Reply, every: float) -> Reply:
    """``reply`` with ``every`` seconds between its frames: each read is quick,
    the call is not. The client hangs up on it, which ``server`` keeps quiet about."""
    server.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
    frames = reply.frames

    def slowly() -> Iterator[bytes]:
        for frame in frames:
            yield frame
            time.sleep(every)

    return Reply(frames=slowly())  # type: ignore[arg-type] - the server only iterates them
