"""The default suite does no I/O and reads no clock or randomness."""

from __future__ import annotations

import builtins
import datetime
import io
import os
import random
import socket
import time

import pytest
from validators_helpers import call, claim, make_input, text

from loopledger.validators import StepRecord, load_suite


class Forbidden(AssertionError):
    pass


def _raise(*args, **kwargs):
    raise Forbidden("a validator touched the outside world")


class _FrozenDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        _raise()

    @classmethod
    def utcnow(cls):
        _raise()

    @classmethod
    def today(cls):
        _raise()


def _inputs():
    history = [StepRecord("run-1", i + 1, calls=("orders.get_order:x",), errors=("RATE_LIMIT",)).to_dict() for i in range(4)]
    facts = {"evidence": [{"kind": "order_found", "subject": "ORD-1042"}], "history": history,
             "operations": [{"operation_id": "op", "tool": "reports.export", "outcome": "background_accepted", "work_id": "w"}]}
    return [
        make_input([call("payments.refund", {"order_id": "ORD-1042", "amount": "25"})], facts=facts),
        make_input([call("workspace.write_file", {"path": "exports/../payments/config.json", "content": "x"})],
                   contract={"forbidden_paths": ["payments/**"], "allowed_tools": ["workspace.*"]}),
        make_input([call("deploy.service@v1", {"service": "api", "version": "1"})]),
        make_input([call("payments.refund", raw='{"order_id": "ORD-')], finish_reason="incomplete"),
        make_input([text("sk-live-ABCDEFGHIJKLMNOPQRST"), claim("refund", "refund_confirmed")], facts=facts,
                   contract={"required_evidence": ["refund_confirmed"]}),
        make_input([{"type": "plan", "steps": ["a", "b"]}, text("ok")], finish_reason="stop"),
    ]


@pytest.mark.parametrize("suite_name", ["default", "strict"])
def test_suites_are_pure(monkeypatch, suite_name):
    suite = load_suite(suite_name)  # loading reads the bundled file: before the patches
    inputs = _inputs()
    for target, attr in [(builtins, "open"), (io, "open"), (os, "open"), (socket, "socket"),
                         (time, "time"), (time, "monotonic"), (time, "time_ns"), (time, "perf_counter"),
                         (random, "random"), (random, "randint"), (random, "choice"), (os, "urandom")]:
        monkeypatch.setattr(target, attr, _raise)
    monkeypatch.setattr(datetime, "datetime", _FrozenDatetime)
    results = [suite.evaluate(inp) for inp in inputs]
    monkeypatch.undo()
    codes = [d.code for r in results for d in r.decisions]
    assert "validator_error" not in codes
    # the checks did run and found what they should (not a vacuous pass)
    assert {"invalid_arguments", "forbidden_path", "stale_tool_version", "incomplete_stream",
            "sensitive_output", "pending_work", "loop_detected"} <= set(codes)
    # and the patches were live: the same call outside the suite raises
    monkeypatch.setattr(time, "time", _raise)
    with pytest.raises(Forbidden):
        time.time()
