"""YAML as the project's input files read it: safe types only, and a key
given twice in one mapping is an error at its line (PyYAML would keep the
last value silently, so ``id: a`` then ``id: b`` would run as ``b``)."""

from __future__ import annotations

from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str) -> Any:
    """``yaml.safe_load``, refusing duplicate keys (a ``yaml.YAMLError``
    whose ``problem_mark`` is the second key)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8 text, for an error message."""
    line = data[:exc.start].count(b"\n") + 1
    return f"line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
