"""What a non-editable install carries: every data file a part reads at run
time (migrations, prompts, scenarios, suites) is named by pyproject.toml's
package-data, and no folder of them is left for setuptools to guess at."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA_SUFFIXES = {".sql", ".md", ".yaml", ".yml", ".json", ".csv"}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_data_file_of_a_part_is_in_package_data() -> None:
    config = _config()
    assert config.get("include-package-data") is False, "data files are listed, not discovered"
    for package, folder in config["package-dir"].items():
        base = ROOT / folder
        listed = {p for pattern in config.get("package-data", {}).get(package, []) for p in base.glob(pattern)}
        present = {p for p in base.rglob("*") if p.suffix in DATA_SUFFIXES and "__pycache__" not in p.parts}
        assert present - listed == set(), f"{package}: not in package-data: {sorted(present - listed)}"


def test_package_data_patterns_each_match_something() -> None:
    config = _config()
    for package, patterns in config["package-data"].items():
        base = ROOT / config["package-dir"][package]
        for pattern in patterns:
            assert list(base.glob(pattern)), f"{package}: {pattern!r} matches no file"


def test_the_licence_file_is_shipped() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert all((ROOT / name).is_file() for name in project["license-files"])
