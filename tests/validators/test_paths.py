"""Canonical workspace paths and globs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopledger.validators import PathRejected, canonical_workspace_path, glob_matches


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
