"""Each top-level package states its public API in ``__all__``, and the
statement is true: every name in it exists, none is listed twice, and every
public class or function the package's own modules define is listed.
(After httpx's tests/test_exported_members.py.)"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

PACKAGES = [
    "loopledger.engine",
    "loopledger.validators",
    "loopledger.replay",
    "loopledger.ui",
    "loopledger.datasets",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_a_true_statement(name: str) -> None:
    package = importlib.import_module(name)
    assert hasattr(package, "__all__"), f"{name} has no __all__"
    exported = list(package.__all__)
    assert all(isinstance(member, str) for member in exported)
    duplicates = sorted({m for m in exported if exported.count(m) > 1})
    assert not duplicates, f"{name}.__all__ lists {duplicates} more than once"

    missing = [m for m in exported if not hasattr(package, m)]
    assert not missing, f"{name}.__all__ names {missing}, which {name} does not have"
    modules = [m for m in exported if isinstance(getattr(package, m), types.ModuleType)]
    assert not modules, f"{name}.__all__ lists modules {modules}"

    # Every public class or function defined inside the package is exported.
    unlisted = []
    for attr, value in vars(package).items():
        if attr.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if (getattr(value, "__module__", "") or "").startswith(name + ".") and attr not in exported:
            unlisted.append(attr)
    assert not unlisted, f"{name} defines public {sorted(unlisted)} but does not list them in __all__"


@pytest.mark.parametrize("name", PACKAGES)
def test_exported_names_are_public(name: str) -> None:
    package = importlib.import_module(name)
    private = [m for m in package.__all__ if m.startswith("_")]
    assert not private, f"{name}.__all__ exports private names {private}"
