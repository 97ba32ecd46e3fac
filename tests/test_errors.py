"""Errors cross process boundaries whole: a worker's error (an import share,
a replay partition, a test's pool) reaches the caller as it was raised."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from loopledger.datasets import ImportInputError
from loopledger.engine._errors import BadInput, StaleStateVersion, TransitionNotAllowed
from loopledger.replay import ReplayInputError
from loopledger.validators._errors import RegistryError, SuiteError

ERRORS = [
    BadInput("s.yaml: budgets.max_steps", "expected an integer"),
    StaleStateVersion("run-1", 3, 4),
    TransitionNotAllowed("run-1", "READY", "SUCCEEDED"),
    SuiteError("strict.yaml: validators[0]", "unknown validator 'x'"),
    RegistryError("acme.x", "unknown validator"),
    ReplayInputError("--suite", "unknown suite"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_is_the_same_after_pickling(error: Exception) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.__dict__ == error.__dict__


def _raise(file: str, record: str) -> None:
    raise ImportInputError(file, record, "expected a JSON object")


def test_a_workers_error_reaches_the_caller_as_raised() -> None:
    with ProcessPoolExecutor(1) as pool, pytest.raises(ImportInputError) as info:
        pool.submit(_raise, "chats.jsonl", "line 3").result(timeout=60)
    error = info.value
    assert (error.file, error.record, error.where, error.reason) == (
        "chats.jsonl", "line 3", "chats.jsonl: line 3", "expected a JSON object")
