"""Canonical workspace paths and globs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopledger.validators import PathRejected, canonical_glob, canonical_workspace_path, glob_matches


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("./exports/../payments/config.json", "payments/config.json"),
        ("exports/../payments/config.json", "payments/config.json"),
        ("src//app.py", "src/app.py"),
        ("src/./a/", "src/a"),
        (".", "."),
        ("a/..", "."),
    ],
)
def test_canonical_forms(raw, canonical):
    assert canonical_workspace_path(raw) == canonical


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("/etc/passwd", "absolute"),
        ("C:/x", "absolute"),
        ("../secrets", "escapes"),
        ("a/../../b", "escapes"),
        ("a\\b", "backslash"),
        ("", "empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_rejected_paths(raw, reason):
    with pytest.raises(PathRejected, match=reason):
        canonical_workspace_path(raw)


@given(st.lists(st.sampled_from(["a", "b", ".", "..", ""]), max_size=8))
def test_canonical_form_is_a_fixed_point(segments):
    try:
        once = canonical_workspace_path("/".join(segments) or ".")
    except PathRejected:
        return
    assert canonical_workspace_path(once) == once
    assert ".." not in once.split("/") and not once.startswith("/")


def test_globs():
    assert glob_matches("payments/**", "payments/config.json")
    assert glob_matches("payments/**", "payments/provider/x.py")
    assert glob_matches("payments/**", "payments")
    assert glob_matches("./payments/**", "payments/a")
    assert not glob_matches("payments/**", "paymentsx/a")
    assert glob_matches("*.env", ".env") and not glob_matches("*.env", "src/.env")
    assert glob_matches("**/*.pem", "keys/deep/a.pem") and glob_matches("**/*.pem", "a.pem")


@pytest.mark.parametrize(
    ("pattern", "canonical"),
    [
        # A leading / or ./ is the workspace root; a trailing / the folder and
        # everything under it; no glob characters: a file or a folder and
        # everything under it, as .gitignore reads it.
        ("payments/", "payments/**"),
        ("payments", "payments/**"),
        ("/payments/**", "payments/**"),
        ("./payments/**", "payments/**"),
        ("/payments", "payments/**"),
        (" ./payments/ ", "payments/**"),
        ("payments//provider/./", "payments/provider/**"),
        ("exports/../payments", "payments/**"),
        ("payments/config.json", "payments/config.json/**"),
        ("payments/**/", "payments/**"),
        ("pay*/", "pay*/**"),
        ("payments/*.json", "payments/*.json"),
        ("*.env", "*.env"),
        ("**/*.pem", "**/*.pem"),
        ("/", "**"),
        (".", "**"),
    ],
)
def test_canonical_globs(pattern, canonical):
    assert canonical_glob(pattern) == canonical


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [("", "empty"), ("  ", "empty"), ("../x", "escapes"), ("a\\b", "backslash"), ("C:/x", "drive letter"),
     ("a\x00b", "NUL"), ("*/../x", "glob characters")],
)
def test_rejected_globs(pattern, reason):
    with pytest.raises(PathRejected, match=reason):
        canonical_glob(pattern)


@pytest.mark.parametrize("pattern", ["payments/", "payments", "/payments/**", "/payments"])
def test_every_spelling_of_a_folder_forbids_what_is_under_it(pattern):
    glob = canonical_glob(pattern)
    for path in ("payments", "payments/config.json", "payments/provider/client.py"):
        assert glob_matches(glob, path), (pattern, path)
    assert not glob_matches(glob, "paymentsx/a") and not glob_matches(glob, "src/payments/a")


def test_glob_matches_keeps_matching_patterns_as_given():
    """Recorded contracts are replayed by the permission validator: its
    matching is unchanged, so old decisions replay as they were made. The
    scenario loader writes patterns in canonical form instead."""
    assert not glob_matches("payments/", "payments/config.json")
    assert not glob_matches("payments", "payments/config.json")
    assert not glob_matches("/payments/**", "payments/config.json")
    assert glob_matches("payments", "payments")


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "*", "**", "?x"]), min_size=1, max_size=8),
       st.booleans(), st.booleans())
def test_canonical_glob_is_a_fixed_point(segments, leading, trailing):
    pattern = ("/" if leading else "") + "/".join(segments) + ("/" if trailing else "")
    try:
        once = canonical_glob(pattern)
    except PathRejected:
        return
    assert canonical_glob(once) == once
    assert not once.startswith(("/", "./")) and not once.endswith("/") and "//" not in once
