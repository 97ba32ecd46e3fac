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


def test_a_home_adds_its_own_prompt_versions(tmp_path: Path) -> None:
    """``<home>/prompts/NAME.md`` is a version of that home, first before the
    bundled ones: chosen with --prompt-version, its text is the run's system
    message and its hash is on the run, its contexts and candidates."""
    import json
    import subprocess
    import sys

    home = tmp_path / "home"
    (home / "prompts").mkdir(parents=True)
    (home / "prompts" / "terse.md").write_bytes(b"You are terse.\n")
    (home / "prompts" / "v2.md").write_bytes(b"This home's own v2.\n")
    scenario = tmp_path / "pv.yaml"
    scenario.write_text("id: pv\ncontract: {goal: g}\nmodel: {default: [{final: a}], terse: [{final: b}]}\n")
    cli = [sys.executable, "-c", "from loopledger._cli import main; main()"]

    def run(version: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, "run", str(scenario), "--prompt-version", version, "--json", "--home", str(home)],
                              capture_output=True, text=True, timeout=120)

    for version, data, answer in (("terse", b"You are terse.\n", "b"), ("v2", b"This home's own v2.\n", "a")):
        done = run(version)
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        runner = Runner(Home.resolve(home, None))
        try:
            record = runner.store.get_run(run_id)
            assert (record.prompt_version, record.prompt_hash) == (version, hashlib.sha256(data).hexdigest())
            (row,) = runner.store.facts("candidates", run_id)
            context = runner.store.get_artifact(row["context_artifact_id"])
            assert context["messages"][0] == {"role": "system", "content": data.decode().strip()}
            assert context["prompt_hash"] == record.prompt_hash
            candidate = runner.store.get_artifact(row["candidate_id"])
            assert candidate["prompt_version"] == version
            assert candidate["items"] == [{"type": "text", "text": answer}]  # the version's own script
        finally:
            runner.close()
    assert versions(home / "prompts") == sorted({*versions(), "terse"})
    for bad, said in (("v9", "no prompt file for 'v9'"), ("v3.1", "expected a name of ASCII letters"),
                      ("../terse", "expected a name of ASCII letters")):
        refused = run(bad)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


def test_the_task_tells_the_model_what_the_answer_is_held_to(tmp_path: Path) -> None:
    """The first user message is the goal with the evidence the completion
    gate requires and the paths the policy forbids: a model learns the
    acceptance criteria from its task, not from its first rejection."""
    runner = Runner(Home.resolve(tmp_path, None))
    try:
        for name, told in (("permission-forbidden-path.yaml", True), ("happy-refund.yaml", False)):
            scenario = load_scenario(SCENARIOS / name)
            run_id = runner.create(scenario, "v1")
            runner.drive_all([run_id])
            first = runner.store.facts("candidates", run_id)[0]
            task = runner.store.get_artifact(first["context_artifact_id"])["messages"][1]
            assert task["role"] == "user" and task["content"].startswith(scenario.contract.goal)
            assert all(e in task["content"] for e in scenario.contract.required_evidence)
            assert scenario.contract.required_evidence
            assert all(p in task["content"] for p in scenario.contract.forbidden_paths)
            assert bool(scenario.contract.forbidden_paths) is told
            assert ("Out of scope" in task["content"]) is told
    finally:
        runner.close()
