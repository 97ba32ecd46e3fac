"""The workspace sandbox: no path escapes the tenant root, and no spelling
reaches a forbidden path.

The workspace under test holds symlinks planted the way an attacker (or a
careless model writing files) would: out of the workspace to a secret, up
into the other tenant's workspace, and inside the workspace onto the
forbidden ``payments/`` folder. Hand-written cases name each trick; the
hypothesis tests throw well over a thousand generated spellings at the
read, list and write tools.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend_kit import request
from loopledger.canonical import canonical_json
from loopledger.engine._backends import DemoBackend, ToolOutcome
from loopledger.validators import PathRejected, canonical_workspace_path, glob_matches

SECRET = "TOP-SECRET-OUTSIDE-THE-WORKSPACE"
FORBIDDEN = ("payments/**",)
GLOBEX_MARKER = "globex_private_marker"


class Sandbox:
    def __init__(self, base: Path) -> None:
        self.home = base / "home"
        self.outside = base / "outside"
        self.outside.mkdir()
        (self.outside / "secret.txt").write_text(SECRET)
        self.backend = DemoBackend(self.home)
        for tenant in ("acme", "globex"):
            assert self.run("workspace.list", ".", tenant=tenant).outcome == "success"
        globex_root = self.home / "workspaces" / "run-1" / "globex"
        (globex_root / "src" / f"{GLOBEX_MARKER}.py").write_text(f"{GLOBEX_MARKER.upper()} = True\n")
        self.root = self.home / "workspaces" / "run-1" / "acme"
        self.root_real = os.path.realpath(self.root)
        links = {
            "src/out": str(self.outside),  # a folder outside, absolute
            "src/secret_link": str(self.outside / "secret.txt"),  # a file outside
            "src/up": "../..",  # the folder of all workspaces (globex is in it)
            "tests/neighbour": "../../globex",  # the other tenant's root
            "src/pay": "../payments",  # inside, onto the forbidden folder
            "payments/cfg": "config.json",  # inside the forbidden folder
            "tests/loop": "loop",  # a symlink loop
        }
        for name, target in links.items():
            os.symlink(target, self.root / name)
        self.globex_config = (self.home / "workspaces" / "run-1" / "globex" / "payments" / "config.json").read_text()

    def run(self, tool: str, path: Any, *, tenant: str = "acme", forbidden: tuple[str, ...] = FORBIDDEN,
            content: str | None = None) -> ToolOutcome:
        args = {"path": path} if content is None else {"path": path, "content": content}
        return self.backend.execute(request(tool, args, tenant=tenant, forbidden_paths=forbidden))

    def inside(self, real: str) -> bool:
        return real == self.root_real or real.startswith(self.root_real + os.sep)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("sandbox"))


def denied(outcome: ToolOutcome) -> bool:
    return outcome.outcome == "permission_denied" and outcome.error_code == "PERMISSION_DENIED" and not outcome.evidence


def assert_no_leak(outcome: ToolOutcome) -> None:
    """Nothing from outside the acme workspace: not the secret, not globex's
    config, not even the name of globex's marker file. (A denial may echo
    the path the caller wrote; that is the caller's own input.)"""
    text = canonical_json(outcome.to_dict())
    assert SECRET not in text
    assert "MER-GLOBEX" not in text
    assert GLOBEX_MARKER not in text.lower()


# --- named tricks -------------------------------------------------------------------------------


ESCAPES = [
    "/etc/passwd",
    "//etc/passwd",
    "C:/Windows/win.ini",
    "C:secret.txt",
    "..",
    "../globex/payments/config.json",
    "./src/../..",
    "./x/../../acme/README.md",
    "src/../../../outside/secret.txt",
    "src\\..\\..\\globex",
    "..\\..\\outside\\secret.txt",
    "src/out/secret.txt",
    "src/out",
    "src/secret_link",
    "src/up/globex/payments/config.json",
    "src/up",
    "tests/neighbour/payments/config.json",
    "tests/neighbour",
    "tests/loop",
    "tests/loop/x",
    "src/\x00/x",
]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("tool", ["workspace.read_file", "workspace.list"])
def test_escapes_are_denied(box: Sandbox, tool: str, path: str) -> None:
    for forbidden in ((), FORBIDDEN):
        outcome = box.run(tool, path, forbidden=forbidden)
        assert denied(outcome), outcome
        assert_no_leak(outcome)


def test_absolute_spelling_of_an_inside_file_is_denied(box: Sandbox) -> None:
    assert denied(box.run("workspace.read_file", str(box.root / "README.md")))
    assert denied(box.run("workspace.read_file", str(box.outside / "secret.txt")))


@pytest.mark.parametrize("path", ["src/out/planted.txt", "src/secret_link", "src/up/planted.txt",
                                  "tests/neighbour/payments/config.json", "../planted.txt", "/tmp/planted.txt"])
def test_writes_cannot_escape(box: Sandbox, path: str) -> None:
    outcome = box.run("workspace.write_file", path, forbidden=(), content="planted")
    assert denied(outcome), outcome
    assert sorted(os.listdir(box.outside)) == ["secret.txt"]
    assert (box.outside / "secret.txt").read_text() == SECRET
    assert sorted(os.listdir(box.home / "workspaces" / "run-1")) == ["acme", "globex"]
    assert (box.home / "workspaces" / "run-1" / "globex" / "payments" / "config.json").read_text() == box.globex_config


def test_a_symlink_loop_is_not_replaced_by_a_write(box: Sandbox) -> None:
    assert denied(box.run("workspace.write_file", "tests/loop", forbidden=(), content="x"))
    assert os.path.islink(box.root / "tests" / "loop")


FORBIDDEN_SPELLINGS = [
    "payments/config.json",
    "./payments/config.json",
    "payments//config.json",
    "src/../payments/config.json",
    "./src/./../payments/provider/../config.json",
    "payments",
    "payments/",
    "payments/provider/client.py",
    "src/pay/config.json",  # a symlink inside the workspace onto the forbidden folder
    "src/pay",
    "payments/cfg",
]


@pytest.mark.parametrize("path", FORBIDDEN_SPELLINGS)
def test_forbidden_paths_are_denied_in_every_spelling(box: Sandbox, path: str) -> None:
    for tool in ("workspace.read_file", "workspace.list"):
        outcome = box.run(tool, path)
        assert denied(outcome), (tool, outcome)
        assert "merchant_id" not in canonical_json(outcome.to_dict())
    assert denied(box.run("workspace.write_file", path, content="overwritten"))
    assert json.loads((box.root / "payments" / "config.json").read_text())["tenant"] == "acme"


def test_without_forbidden_globs_an_inside_symlink_is_followed(box: Sandbox) -> None:
    outcome = box.run("workspace.read_file", "src/pay/config.json", forbidden=())
    assert outcome.outcome == "success"
    # The evidence names the path that was authorised, not the one on disk.
    assert outcome.evidence == ({"kind": "file_read", "subject": "src/pay/config.json"},)
    assert json.loads(outcome.result["content"])["tenant"] == "acme"


def test_listing_hides_forbidden_entries(box: Sandbox) -> None:
    listing = box.run("workspace.list", ".")
    assert "payments" not in {e["name"] for e in listing.result["entries"]} and listing.result["hidden"] == 1
    src = {e["name"]: e["type"] for e in box.run("workspace.list", "src").result["entries"]}
    assert src["out"] == "symlink" and src["orders.py"] == "file"


def test_an_invalid_tenant_name_cannot_name_a_folder(box: Sandbox) -> None:
    for tenant in ("../globex", "acme/../globex", ".", "", "a" * 65):
        outcome = box.run("workspace.read_file", "payments/config.json", tenant=tenant, forbidden=())
        assert denied(outcome)
        assert_no_leak(outcome)


# --- generated paths ------------------------------------------------------------------------------

# Plausible paths walk the planted tree, symlinks included, with `.`, `..`
# and empty segments mixed in; hostile ones add every spelling trick. Both
# are needed: a generator of mostly nonsense only ever tests the lexical gate.
_ROOT = ["README.md", "src", "tests", "payments"]
_CHILDREN = {
    "": _ROOT,
    "src": ["__init__.py", "orders.py", "refunds.py", "out", "secret_link", "up", "pay"],
    "tests": ["test_orders.py", "test_refunds.py", "neighbour", "loop"],
    "payments": ["config.json", "cfg", "provider"],
    "pay": ["config.json", "cfg", "provider"],
    "provider": ["__init__.py", "client.py"],
    "out": ["secret.txt"],
    "up": ["acme", "globex"],
    "acme": _ROOT,
    "globex": _ROOT,
    "neighbour": _ROOT,
    "loop": ["loop", "x"],
}
_NAMES = sorted({name for names in _CHILDREN.values() for name in names})
_TRICKS = st.sampled_from([
    "...", "~", "%2e%2e", "..%2f", ".. ", " ..", "..\u2215", "\u2025", "ｐａｙｍｅｎｔｓ", "PAYMENTS", "payments\u200b",
    "pay\u0301ments", "C:", "\\", "..\\..", "\x00",
])
_FREE = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)


@st.composite
def _plausible(draw: st.DrawFn) -> str:
    stack: list[str] = []
    parts: list[str] = []
    for _ in range(draw(st.integers(1, 7))):
        here = stack[-1] if stack else ""
        step = draw(st.sampled_from(_CHILDREN.get(here, _ROOT) * 3 + ["..", ".", ""]))
        parts.append(step)
        if step == "..":
            if stack:
                stack.pop()
        elif step not in (".", ""):
            stack.append(step)
    path = draw(st.sampled_from(["", "", "", "./", "/", "../"]))
    for index, part in enumerate(parts):
        path += (draw(st.sampled_from(["/", "/", "/", "//", "/./"])) if index else "") + part
    return path + draw(st.sampled_from(["", "", "/", "/."]))


@st.composite
def _hostile(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(_NAMES + ["..", "."]), _TRICKS, _FREE), min_size=1, max_size=7))
    path = draw(st.sampled_from(["", "", "/", "./", "../", "~/", "C:", "\\\\server\\", "file:", "/proc/self/root/"]))
    for index, part in enumerate(parts):
        path += (draw(st.sampled_from(["/", "/", "//", "\\"])) if index else "") + part
    return path


def workspace_paths() -> st.SearchStrategy[str]:
    return st.one_of(_plausible(), _plausible(), _hostile())


def check_contained(box: Sandbox, path: str, outcome: ToolOutcome, forbidden: tuple[str, ...]) -> None:
    assert_no_leak(outcome)
    if outcome.outcome != "success":
        assert outcome.outcome in ("permission_denied", "validation_failed") and not outcome.evidence
        return
    canonical = canonical_workspace_path(path)  # success means it had a canonical form
    joined = box.root_real if canonical == "." else os.path.join(box.root_real, *canonical.split("/"))
    real = os.path.realpath(joined)
    assert box.inside(real), (path, real)
    relative = "." if real == box.root_real else os.path.relpath(real, box.root_real)
    for pattern in forbidden:
        assert not glob_matches(pattern, canonical) and not glob_matches(pattern, relative), (path, relative)
    assert outcome.evidence[0]["subject"] == canonical


def test_generated_paths_never_escape_nor_reach_forbidden_ones(box: Sandbox) -> None:
    seen: set[str] = set()
    results: Counter[str] = Counter()

    @settings(max_examples=1300, deadline=None, database=None)
    @given(path=workspace_paths())
    def check(path: str) -> None:
        seen.add(path)
        for tool in ("workspace.read_file", "workspace.list"):
            for forbidden in ((), FORBIDDEN):
                outcome = box.run(tool, path, forbidden=forbidden)
                check_contained(box, path, outcome, forbidden)
                reason = outcome.result.get("reason") if isinstance(outcome.result, dict) else None
                results[outcome.outcome if reason is None else reason] += 1
        # The validators' view agrees: every spelling the sandbox resolves
        # lexically into payments/ is caught by the glob on its canonical form.
        try:
            canonical = canonical_workspace_path(path)
        except PathRejected:
            return
        if canonical == "payments" or canonical.startswith("payments/"):
            assert glob_matches("payments/**", canonical)

    check()
    assert len(seen) >= 1000
    # Not vacuous: the generated paths reached files, and every gate fired.
    for result in ("success", "symlink leaves the workspace", "symlink loop", "forbidden path",
                   "escapes the workspace root", "absolute path; workspace paths are relative to the root"):
        assert results[result] >= 5, results


def test_generated_writes_stay_inside(box: Sandbox) -> None:
    @settings(max_examples=150, deadline=None, database=None)
    @given(path=workspace_paths())
    def check(path: str) -> None:
        outcome = box.run("workspace.write_file", path, content="probe")
        check_contained(box, path, outcome, FORBIDDEN)
        assert sorted(os.listdir(box.outside)) == ["secret.txt"]
        assert sorted(os.listdir(box.home / "workspaces" / "run-1")) == ["acme", "globex"]
        assert json.loads((box.root / "payments" / "config.json").read_text())["tenant"] == "acme"

    check()
    assert (box.outside / "secret.txt").read_text() == SECRET
