"""YAML as the project's input files read it: safe types only, and a key
given twice in one mapping is an error at its line (PyYAML would keep the
last value silently, so ``id: a`` then ``id: b`` would run as ``b``).
Values are JSON values: a date (``2024-01-01``) is read as its text, as
YAML 1.2 reads it, and ``!!set``, ``!!binary``, ``!!omap`` and ``!!pairs``
are refused at their line (a set's order would change from run to run).

Anchors and aliases are bounded. PyYAML builds an alias as a shared
reference, which costs nothing, but everything that reads the data after it
(checks, validation, the JSON a run's spec is frozen into) walks the
expanded tree: ten lines of nested aliases ("billion laughs") expand to
hundreds of millions of nodes. So the nodes aliases repeat are counted while
the file is composed, from the node graph, without expanding anything: beyond
:data:`MAX_ALIASED_NODES` in one file, or an alias inside the node it names
(a cycle), the file is refused at that alias's line. Nesting deeper than
:data:`MAX_DEPTH` is refused too (it would exhaust Python's stack).
"""

from __future__ import annotations

from typing import Any

import yaml

#: How many nodes aliases may repeat in one file, in all: an alias of a
#: node of ``n`` nodes (counting the node itself and everything under it,
#: aliases expanded) repeats ``n``. Reusing a model entry or a list a few
#: times stays far below it.
MAX_ALIASED_NODES = 10_000
#: How deep collections may nest in one file.
MAX_DEPTH = 100


class LimitExceeded(yaml.composer.ComposerError):
    """Valid YAML beyond what an input file may hold (aliases that repeat too
    much, a cyclic alias, nesting too deep, a value JSON has no form for:
    ``!!set``, ``!!binary``, ``!!omap``, ``!!pairs``); ``problem_mark`` is
    where."""


class _UniqueKeyLoader(yaml.SafeLoader):
    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> its node count, aliases expanded
        self._aliased = 0  # nodes repeated by aliases so far
        self._depth = 0

    def compose_document(self) -> yaml.Node:
        self._sizes, self._aliased, self._depth = {}, 0, 0
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)  # the anchored node itself, shared
            size = self._sizes.get(id(node))
            if size is None:  # its anchor's node is still being composed: the alias is inside it
                raise LimitExceeded(None, None, f"alias *{event.anchor} is inside the node it names "
                                    "(a cycle); expected an alias after its anchor's node", event.start_mark)
            self._aliased += size
            if self._aliased > MAX_ALIASED_NODES:
                raise LimitExceeded(None, None, f"alias *{event.anchor} repeats {size:,} nodes, {self._aliased:,} "
                                    "with the aliases before it; expected aliases that repeat at most "
                                    f"{MAX_ALIASED_NODES:,} nodes in a file", event.start_mark)
            return node
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise LimitExceeded(None, None, f"collections nested more than {MAX_DEPTH} deep",
                                    self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in children)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *base``: keys merged in may be given again (SafeLoader merges them)
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

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        # ``2024-01-01`` is the text it reads as, as YAML 1.2 and JSON read
        # it: a date object is no JSON value, and a string field given one
        # would be refused (or it would be written back as another text).
        return str(self.construct_scalar(node))

    def _not_json(self, node: yaml.Node) -> Any:
        kind = node.tag.rsplit(":", 1)[-1]
        raise LimitExceeded(None, None, f"a !!{kind} value; expected JSON values only (mappings, lists, strings, "
                            "numbers, true, false, null)", node.start_mark)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _UniqueKeyLoader.construct_yaml_timestamp)
for _tag in ("set", "binary", "omap", "pairs"):
    _UniqueKeyLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _UniqueKeyLoader._not_json)


def load(text: str) -> Any:
    """``yaml.safe_load``, refusing duplicate keys (a ``yaml.YAMLError``
    whose ``problem_mark`` is the second key) and aliases or nesting beyond
    the limits above (a :class:`LimitExceeded` at the alias or the level)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def not_utf8(data: bytes, exc: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8 text, for an error message."""
    line = data[:exc.start].count(b"\n") + 1
    return f"line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x})"
