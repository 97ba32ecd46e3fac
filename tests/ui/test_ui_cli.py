"""`loopledger ui` as a user meets it: help without heavy imports, a busy port refused."""

from __future__ import annotations

import json
import subprocess
import sys


def test_ui_help_is_fast_and_imports_no_streamlit() -> None:
    code = (
        "import sys, json\n"
        "from typer.testing import CliRunner\n"
        "from loopledger._cli import app\n"
        "result = CliRunner().invoke(app, ['ui', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert '--port' in result.output and '--home' in result.output\n"
        "print(json.dumps([m for m in ('streamlit', 'duckdb', 'pyarrow', 'plotly') if m in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_busy_port_is_bad_input_before_anything_starts(tmp_path) -> None:
    import socket
    from pathlib import Path

    loopledger = str(Path(sys.executable).with_name("loopledger"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([loopledger, "ui", "--port", str(port), "--home", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == f"loopledger: bad input: --port: 127.0.0.1:{port} is already in use; expected a free port"
