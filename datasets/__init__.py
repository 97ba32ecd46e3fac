"""Bundled scenarios and suites, demo tool backends' seed data, and
importers of external trace formats."""

__all__: list[str] = []
