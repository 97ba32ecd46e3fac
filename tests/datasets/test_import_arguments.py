"""``import_traces``'s arguments: one path is one path (never its
characters), and a wrong argument is one ``ImportInputError`` naming it as
Python spells it, before any file is read and with nothing recorded lost;
the command line names its own options instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from import_kit import cli, table

from loopledger.datasets import ImportInputError, import_traces, read_conversations

CHAT = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}


def _chats(folder: Path, name: str = "chats.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(CHAT) + "\n")
    return path


def _files(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def test_a_single_path_is_one_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _chats(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    assert import_traces("openai-jsonl", "runs/", home="home").runs == 1
    assert import_traces("openai-jsonl", tmp_path / "runs", home="home").skipped == 1
    (read,) = read_conversations("openai-jsonl", "runs")
    assert read[0] == Path("runs/chats.jsonl")


@pytest.mark.parametrize(("call", "argument"), [
    ({"paths": None}, "paths"),
    ({"paths": 3}, "paths"),
    ({"paths": []}, "paths"),
    ({"paths": [3]}, "paths[0]"),
    ({"paths": ["runs", None]}, "paths[1]"),
    ({"paths": [""]}, "paths[0]"),
    ({"paths": {"runs": 1}}, "paths"),
    ({"home": 3}, "home"),
    ({"home": ["home"]}, "home"),
    ({"fmt": None}, "fmt"),
    ({"fmt": ["tau2"]}, "fmt"),
    ({"fmt": "csv"}, "fmt"),
    ({"tools": 3}, "tools"),
    ({"tools": "no-such-tools.json"}, "tools"),
    ({"decide": 3}, "decide"),
    ({"decide": "nosuch"}, "decide"),
])
def test_a_wrong_argument_is_named_and_nothing_recorded_is_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                call: dict[str, Any], argument: str) -> None:
    _chats(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    import_traces("openai-jsonl", ["runs"], home=home)
    _chats(tmp_path / "runs", "more.jsonl")
    before = _files(home)
    given = {"fmt": "openai-jsonl", "paths": ["runs"], "home": home, **call}
    with pytest.raises(ImportInputError) as caught:
        import_traces(given.pop("fmt"), given.pop("paths"), **given)
    message = str(caught.value)
    assert caught.value.file == argument and message.startswith(f"{argument}: "), message
    assert "--" not in message and "FORMAT" not in message, message
    assert _files(home) == before and not (tmp_path / "3").exists()
    assert len(table(home, "runs")) == 1


def test_the_command_line_names_its_options(tmp_path: Path) -> None:
    path = _chats(tmp_path / "runs")
    home = str(tmp_path / "home")
    for args, start in ((["csv", str(path)], "FORMAT: unknown format 'csv'"),
                        (["openai-jsonl", str(path), "--decide", "nosuch"], "--decide: unknown suite 'nosuch'"),
                        (["openai-jsonl", str(path), "--tools", str(tmp_path / "none.json")], "--tools: no such file")):
        out = cli("import", *args, "--home", home)
        assert out.returncode == 2, out.stdout
        assert out.stderr.startswith(f"loopledger: bad input: {start}"), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_a_path_that_is_not_a_file_says_what_it_is(tmp_path: Path) -> None:
    """/dev/null exists: it is named as the device it is, not as missing."""
    home = str(tmp_path / "home")
    for path, reason in (("/dev/null", "exists but is a character device, not a regular file"),
                         (str(tmp_path / "nope.jsonl"), "no such file or folder")):
        out = cli("import", "openai-jsonl", path, "--home", home)
        assert out.returncode == 2, out.stdout
        assert out.stderr.startswith(f"loopledger: bad input: {path}: {reason}"), out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_a_file_named_like_an_argument_is_still_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an argument's own error is renamed for the command line: a file
    that happens to be called ``decide`` keeps its name."""
    (tmp_path / "decide").write_text("not json\n")
    monkeypatch.chdir(tmp_path)
    out = cli("import", "openai-jsonl", "decide", "--home", str(tmp_path / "home"))
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith("loopledger: bad input: decide: "), out.stderr
