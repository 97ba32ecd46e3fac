"""Bad input to ``replay`` and ``replay_many`` is one ``ReplayInputError``
naming the argument, raised before any work (nothing written, nothing
already written lost); one result per suite; no unfinished replay left
behind by any failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopledger.replay import REPLAY_ID, BaselineNotFound, ReplayInputError, SuiteNotFound, replay, replay_many
from loopledger.replay import _harness


def _traces(recorded_home: Path) -> Path:
    return recorded_home / "traces"


@pytest.mark.parametrize(
    ("args", "kwargs", "argument", "error"),
    [
        ((None, "default"), {}, "traces", ReplayInputError),
        ((42, "default"), {}, "traces", ReplayInputError),
        (("", "default"), {}, "traces", ReplayInputError),
        ((..., None), {}, "suite", SuiteNotFound),
        ((..., 3), {}, "suite", SuiteNotFound),
        ((..., "no-such-suite"), {}, "suite", SuiteNotFound),
        ((..., "default"), {"baseline": None}, "baseline", ReplayInputError),
        ((..., "default"), {"baseline": 3}, "baseline", ReplayInputError),
        ((..., "default"), {"baseline": "../elsewhere"}, "baseline", BaselineNotFound),
        ((..., "default"), {"write_to": 3}, "write_to", ReplayInputError),
        ((..., "default"), {"workers": "2"}, "workers", ReplayInputError),
        ((..., "default"), {"workers": 0}, "workers", ReplayInputError),
        ((..., "default"), {"workers": True}, "workers", ReplayInputError),
        ((..., "default"), {"replay_id": "../escaped"}, "replay_id", ReplayInputError),
        ((..., "default"), {"replay_id": "a/b"}, "replay_id", ReplayInputError),
        ((..., "default"), {"replay_id": ".hidden"}, "replay_id", ReplayInputError),
        ((..., "default"), {"replay_id": "r1.partial"}, "replay_id", ReplayInputError),
        ((..., "default"), {"replay_id": ""}, "replay_id", ReplayInputError),
        ((..., "default"), {"replay_id": 7}, "replay_id", ReplayInputError),
    ],
)
def test_a_wrong_argument_is_named_before_any_work(recorded_home: Path, tmp_path: Path, args: tuple,
                                                   kwargs: dict, argument: str, error: type) -> None:
    traces = _traces(recorded_home) if args[0] is ... else args[0]
    kwargs = {"write_to": tmp_path / "replays", **kwargs}
    with pytest.raises(error) as caught:
        replay(traces, *args[1:], **kwargs)
    assert caught.value.where == argument, str(caught.value)
    assert str(caught.value).startswith(f"{argument}: ") and "--" not in str(caught.value)
    assert not (tmp_path / "replays").exists() and not (tmp_path / "escaped").exists()


def test_write_to_naming_a_file_is_refused(recorded_home: Path, tmp_path: Path) -> None:
    path = tmp_path / "replays"
    path.write_text("not a folder")
    with pytest.raises(ReplayInputError, match=r"^write_to: .* is not a folder"):
        replay(_traces(recorded_home), "default", write_to=path)
    assert path.read_text() == "not a folder"


def test_a_replay_id_is_a_plain_name() -> None:
    for good in ("r20250101-120000-1a2b3c", "nightly:2025.01", "a_b-c", _harness.new_replay_id()):
        assert REPLAY_ID.fullmatch(good), good
    for bad in ("", ".", "..", ".x", "../x", "a/b", "a\\b", "a b", "x\n", "é", "x" * 129):
        assert not REPLAY_ID.fullmatch(bad), bad


def test_an_existing_replay_id_is_refused_and_kept_whole(recorded_home: Path, tmp_path: Path) -> None:
    replays = tmp_path / "replays"
    first = replay(_traces(recorded_home), "default", write_to=replays, replay_id="nightly")
    before = sorted(p.relative_to(replays) for p in replays.rglob("*"))
    with pytest.raises(ReplayInputError, match=r"^replay_id: a replay 'nightly' already exists") as caught:
        replay(_traces(recorded_home), "strict", write_to=replays, replay_id="nightly")
    assert caught.value.where == "replay_id"
    assert sorted(p.relative_to(replays) for p in replays.rglob("*")) == before
    assert first.path == replays / "nightly"
    # An interrupted replay's folder is not taken over either.
    (replays / "again.partial").mkdir()
    with pytest.raises(ReplayInputError, match=r"^replay_id: .*again\.partial exists"):
        replay(_traces(recorded_home), "default", write_to=replays, replay_id="again")


def test_two_replays_given_one_id_at_once_leave_one_whole_replay(recorded_home: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two callers passing the id check at the same moment: the one that
    comes second, whether the first is still under way (its ``.partial``
    folder made) or already published, is refused with the argument named,
    and what the first made is left as it was (not written into, renamed
    over or removed)."""
    replays = tmp_path / "replays"
    monkeypatch.setattr(_harness, "_new_ids", lambda ids, _replays: tuple(rid for _, rid in ids))
    under_way = replays / "race.partial"
    under_way.mkdir(parents=True)
    (under_way / "marker").write_text("the first replay's")
    with pytest.raises(ReplayInputError, match=r"^replay_ids\[1\]: .*race\.partial exists: a replay with this id"):
        replay_many(_traces(recorded_home), ["strict", "default"], write_to=replays, replay_ids=["other", "race"])
    assert sorted(p.name for p in replays.iterdir()) == ["race.partial"]
    assert [p.name for p in under_way.iterdir()] == ["marker"]

    (under_way / "marker").unlink()
    under_way.rmdir()
    first = replay(_traces(recorded_home), "default", write_to=replays, replay_id="race")
    published = sorted(p.relative_to(replays) for p in replays.rglob("*"))
    with pytest.raises(ReplayInputError, match=r"^replay_id: a replay 'race' already exists"):
        replay(_traces(recorded_home), "strict", write_to=replays, replay_id="race")
    assert sorted(p.relative_to(replays) for p in replays.rglob("*")) == published
    assert first.path == replays / "race"


def test_no_unfinished_replay_is_left_by_a_failure(recorded_home: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    replays = tmp_path / "replays"

    def broken(*args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(_harness, "_summary", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        replay_many(_traces(recorded_home), ["default", "strict"], write_to=replays, replay_ids=["a1", "a2"])
    assert list(replays.iterdir()) == []


def test_replay_many_ids_are_one_per_suite(recorded_home: Path, tmp_path: Path) -> None:
    traces, replays = _traces(recorded_home), tmp_path / "replays"
    with pytest.raises(ReplayInputError, match=r"^replay_ids: expected one id per suite \(2\), got 1$"):
        replay_many(traces, ["default", "strict"], write_to=replays, replay_ids=["x1"])
    with pytest.raises(ReplayInputError, match=r"^replay_ids\[1\]: 'x1' is given twice"):
        replay_many(traces, ["default", "strict"], write_to=replays, replay_ids=["x1", "x1"])
    with pytest.raises(ReplayInputError, match=r"^replay_ids\[0\]: expected a plain name"):
        replay_many(traces, ["default", "strict"], write_to=replays, replay_ids=["../x", "x2"])
    assert not replays.exists()


def test_replay_many_takes_a_single_suite_as_a_list_of_one(recorded_home: Path) -> None:
    results = replay_many(_traces(recorded_home), "strict")
    assert list(results) == ["strict"]
    assert results["strict"].summary.suite_name == "strict"
    with pytest.raises(TypeError):  # read-only, as the results in it are frozen
        results["strict"] = results["strict"]  # type: ignore[index]


def test_replay_many_gives_one_result_per_suite(recorded_home: Path, tmp_path: Path) -> None:
    traces = _traces(recorded_home)
    default_file = Path(__file__).resolve().parents[2] / "datasets" / "suites" / "default.yaml"
    with pytest.raises(ReplayInputError, match=r"^suites\[1\]: 'strict' is suite 'strict' s-[0-9a-f]{16}, "
                                               r"as suites\[0\] is; expected each suite once$"):
        replay_many(traces, ["strict", "strict"])
    with pytest.raises(ReplayInputError, match=r"^suites\[1\]: .*default\.yaml' is suite 'default'"):
        replay_many(traces, ["default", str(default_file)])
    # Two suites of one name, judging differently: two results.
    other = tmp_path / "default.yaml"
    changed = default_file.read_text().replace("loop.repeated_call@1: {threshold: 3}",
                                               "loop.repeated_call@1: {threshold: 2}")
    assert changed != default_file.read_text()
    other.write_text(changed)
    results = replay_many(traces, ["default", other])
    assert len(results) == 2
    (second,) = [key for key in results if key != "default"]
    assert second == f"default@{results[second].summary.suite_version}"
    for bad, argument in ((3, "suites"), (None, "suites"), ([], "suites"), (["default", None], "suites[1]")):
        with pytest.raises(ReplayInputError) as caught:
            replay_many(traces, bad)
        assert caught.value.where == argument, str(caught.value)


@pytest.mark.parametrize(("args", "start"), [
    (["--suite", "nope"], "--suite: unknown suite 'nope'"),
    (["--suite", "default", "--baseline", "../elsewhere"], "--baseline: '../elsewhere' is not a replay id"),
])
def test_the_replay_command_names_its_options(recorded_home: Path, tmp_path: Path, args: list[str],
                                              start: str) -> None:
    from replay_kit import cli

    out = cli("replay", *args, "--traces", str(_traces(recorded_home)), "--home", str(tmp_path))
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith(f"loopledger: bad input: {start}"), out.stderr
