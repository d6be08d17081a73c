"""Reading a fleet file: YAML with unique keys and a depth limit, validated into `Fleet`, then
checked whole (`checked`: every cross-reference, `agentpost.fleet.checks`). A bad file raises
`FleetError` naming the file, the entry and the problem on one line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from agentpost.fleet.checks import check_references
from agentpost.fleet.model import (
    MAX_DEPTH,
    Fleet,
    FleetError,
)

# -- loading --------------------------------------------------------------------------------


class _TooDeep(yaml.composer.ComposerError):
    """A document nested deeper than MAX_DEPTH."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping with the same key twice (PyYAML keeps the
    last silently, which would hide half of a definition) and nesting deeper than
    MAX_DEPTH (PyYAML composes nodes recursively: 5,000 levels were a RecursionError)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.ScalarEvent, yaml.AliasEvent):  # no level of its own
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _TooDeep(None, None, f"nested deeper than {MAX_DEPTH} levels",
                           self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_fleet(path: str | Path) -> Fleet:
    """The fleet of the YAML file at `path`, validated whole; FleetError otherwise."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError(source, "", f"cannot read it: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    return parse_fleet(text, source)


def parse_fleet(text: str, source: str = "<fleet>") -> Fleet:
    """The fleet of YAML `text`; `source` names it in errors."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if not isinstance(exc, _TooDeep):
            problem = f"not valid YAML: {problem}"
        raise FleetError(source, line, problem) from None
    return fleet_from_dict(data, source)


def fleet_from_dict(data: object, source: str = "<fleet>") -> Fleet:
    """The fleet of an already parsed document (a mapping)."""
    if not isinstance(data, Mapping):
        raise FleetError(source, "", "a fleet file is a mapping with name, roles, types, "
                         "workspaces, scopes and agents")
    if _too_deep(data):
        raise FleetError(source, "", f"nested deeper than {MAX_DEPTH} levels")
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FleetError(source, _entry(data, first["loc"]), _problem(first)) from None
    fleet._source = source
    return checked(fleet)


def _too_deep(data: object) -> bool:
    """Whether `data` nests mappings and lists deeper than MAX_DEPTH, without recursing. A
    node shared by several parents (a YAML alias) is walked again only when reached deeper
    than before, so shared nodes cost no exponential walk."""
    deepest: dict[int, int] = {}
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Mapping | list | tuple):
            continue
        if depth > MAX_DEPTH:
            return True
        if deepest.get(id(node), 0) >= depth:
            continue
        deepest[id(node)] = depth
        children = node.values() if isinstance(node, Mapping) else node
        stack.extend((child, depth + 1) for child in children)
    return False


def checked(fleet: Fleet) -> Fleet:
    """`fleet` if its entries agree with each other, else FleetError for the first problem
    (a Fleet built directly, not from a file, has had its fields checked only)."""
    problems = list(check_references(fleet))
    if problems:
        entry, problem = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise FleetError(fleet.source, entry, problem + more)
    return fleet


def _entry(data: Mapping[str, Any], loc: tuple[Any, ...]) -> str:
    """``agents[2] (driver-c).schedule`` from a pydantic location in the document. Steps
    that are no key of the document (a union member's name) are left out, but for the
    last (a missing or unknown field)."""
    parts: list[str] = []
    node: Any = data
    for position, item in enumerate(loc):
        if isinstance(item, int) and parts:
            node = node[item] if isinstance(node, list) and item < len(node) else None
            label = node.get("name") or node.get("id") if isinstance(node, Mapping) else None
            parts[-1] += f"[{item}]" + (f" ({label})" if isinstance(label, str) else "")
        elif isinstance(node, Mapping) and item in node:
            parts.append(str(item))
            node = node[item]
        elif position == len(loc) - 1:
            parts.append(str(item))
    return ".".join(parts)


def _problem(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    if error.get("type") == "missing":
        return "missing (required)"
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    return message.removeprefix("Value error, ").splitlines()[0]

__all__ = [
    "checked",
    "fleet_from_dict",
    "load_fleet",
    "parse_fleet",
]
