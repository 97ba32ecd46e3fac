"""The external traces (tau-bench, tau2, ToolBench) and homes imported from them.

The data lives outside the repository (``shared/datasets/external`` beside
it in CI). ``$LOOPLEDGER_EXTERNAL_DATA`` names it; otherwise the folder is
found by walking up from the repository root. Tests that need it skip, with
the reason, only when it is truly absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_kit import find_external

@pytest.fixture(scope="session")
def external() -> Path:
    found = find_external()
    if found is None or not (found / "tau-bench").is_dir():
        pytest.skip("external traces not found: set LOOPLEDGER_EXTERNAL_DATA or put shared/datasets/external "
                    "beside the repository")
    return found


@pytest.fixture(scope="session")
def tau2_files(external: Path) -> list[Path]:
    return sorted((external / "tau2-bench-grok-runs" / "simulations").glob("*.json.gz"))


@pytest.fixture(scope="session")
def real_home(external: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All 786 runs (tau-bench and tau2) imported once, through the API."""
    from loopledger.datasets import import_traces

    home = tmp_path_factory.mktemp("real")
    import_traces("tau-bench", [external / "tau-bench" / "trajectories"], home=home)
    import_traces("tau2", [external / "tau2-bench-grok-runs" / "simulations"], home=home)
    return home
