"""Prompt versions are files, identified by name and content hash; the hash
is recorded on every context and candidate of a run."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import pytest
from loopledger.engine._errors import BadInput
from loopledger.engine._home import Home
from loopledger.engine._prompts import check_prompt_version, load_prompt, versions
from loopledger.engine._runner import Runner
from loopledger.engine._scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "datasets" / "scenarios"


def test_each_version_is_a_file_and_its_hash_is_the_files() -> None:
    assert {"v1", "v2"} <= set(versions())
    for version in versions():
        data = resources.files("loopledger.engine").joinpath("prompts", f"{version}.md").read_bytes()
        prompt = load_prompt(version)
        assert prompt.sha256 == hashlib.sha256(data).hexdigest() and prompt.text == data.decode().strip()
    assert check_prompt_version("v2") == load_prompt("v2")


def test_unknown_and_path_like_versions_are_refused() -> None:
    for bad in ("v9", "../v1", "", ".hidden"):
        with pytest.raises(BadInput):
            check_prompt_version(bad)


def test_the_hash_is_on_every_context_and_candidate_of_a_run(tmp_path: Path) -> None:
    runner = Runner(Home.resolve(tmp_path, None))
    try:
        run_id = runner.create(load_scenario(SCENARIOS / "happy-refund.yaml"), "v2")
        runner.drive_all([run_id])
        store = runner.store
        candidates = store.facts("candidates", run_id)
        assert len(candidates) >= 2
        expected = load_prompt("v2").sha256
        for row in candidates:
            body = store.get_artifact(row["candidate_id"])
            context = store.get_artifact(row["context_artifact_id"])
            assert (body["prompt_version"], body["prompt_hash"]) == ("v2", expected)
            assert (context["prompt_version"], context["prompt_hash"]) == ("v2", expected)
    finally:
        runner.close()
