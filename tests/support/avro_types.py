"""Compare an Avro schema with the TypedDicts that claim to mirror it.

:func:`drift` walks every record of an (assembled, self-contained) schema and lists each
disagreement with the TypedDict of the same name in a module: a record without a TypedDict,
keys that differ from the field names, a field that is not required, a field whose Python type
does not correspond to its Avro type. The correspondence is the one written in
``connectors/core/mail/event.py``: ``["null", X]`` -> ``X | None``, arrays -> ``list[...]``,
nested records -> the nested TypedDict, enums -> ``Literal`` of all symbols (or ``str``),
``timestamp-millis`` -> ``datetime``.
"""

from __future__ import annotations

import datetime as dt
import typing
from collections.abc import Iterator
from types import ModuleType
from typing import Any, Literal, Union, get_type_hints

_PRIMITIVES: dict[str, Any] = {
    "string": str,
    "int": int,
    "long": int,
    "boolean": bool,
    "float": float,
    "double": float,
    "bytes": bytes,
    "null": type(None),
}
_LOGICAL: dict[str, Any] = {"timestamp-millis": dt.datetime, "timestamp-micros": dt.datetime}


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _Walker:
    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.records: dict[str, dict[str, Any]] = {}  # full name -> record node
        self.enums: dict[str, dict[str, Any]] = {}

    def expected(self, node: Any, namespace: str) -> Any:
        """The Python type that corresponds to an Avro type node (registers named types)."""
        if isinstance(node, list):
            branches = tuple(self.expected(branch, namespace) for branch in node)
            return Union[branches]  # noqa: UP007 - built from a tuple at run time
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _PRIMITIVES[node]
            full = _full_name(node, namespace)
            if full in self.records:
                return self._typed_dict(full)
            if full in self.enums:
                return Literal[tuple(self.enums[full]["symbols"])]
            raise AssertionError(f"unknown Avro type name {node!r}")
        kind = node["type"]
        if "logicalType" in node and node["logicalType"] in _LOGICAL:
            return _LOGICAL[node["logicalType"]]
        if kind == "array":
            return list[self.expected(node["items"], namespace)]  # type: ignore[misc]
        if kind == "map":
            return dict[str, self.expected(node["values"], namespace)]  # type: ignore[misc]
        if kind == "enum":
            self.enums[_full_name(node["name"], node.get("namespace", namespace))] = node
            return Literal[tuple(node["symbols"])]
        if kind == "record":
            full = _full_name(node["name"], node.get("namespace", namespace))
            self.records[full] = node
            inner = node.get("namespace", namespace)
            for field in node["fields"]:
                self.expected(field["type"], inner)  # define the nested named types
            return self._typed_dict(full)
        return self.expected(kind, namespace)

    def _typed_dict(self, full_name: str) -> Any:
        return getattr(self.module, full_name.rpartition(".")[2], full_name)


def _accepts(declared: Any, expected: Any) -> bool:
    """``declared`` equals ``expected``; ``str`` is accepted for an enum's ``Literal``."""
    if declared == expected:
        return True
    if typing.get_origin(expected) is Literal:
        return declared is str
    if typing.get_origin(expected) is Union and typing.get_origin(declared) in (Union, _UnionType):
        declared_args, expected_args = typing.get_args(declared), typing.get_args(expected)
        return len(declared_args) == len(expected_args) and all(
            any(_accepts(d, e) for d in declared_args) for e in expected_args
        )
    if typing.get_origin(expected) is list and typing.get_origin(declared) is list:
        return _accepts(typing.get_args(declared)[0], typing.get_args(expected)[0])
    return False


_UnionType = type(int | None)


def drift(schema: dict[str, Any], module: ModuleType) -> list[str]:
    """Every way the TypedDicts in ``module`` differ from ``schema``'s records; [] when none."""
    walker = _Walker(module)
    walker.expected(schema, schema.get("namespace", ""))
    return list(_problems(walker))


def _problems(walker: _Walker) -> Iterator[str]:
    for full_name, node in list(walker.records.items()):
        name = full_name.rpartition(".")[2]
        typed = getattr(walker.module, name, None)
        if typed is None or not typing.is_typeddict(typed):
            yield f"{full_name}: no TypedDict {name} in {walker.module.__name__}"
            continue
        fields = [field["name"] for field in node["fields"]]
        hints = get_type_hints(typed)
        if set(hints) != set(fields):
            yield (
                f"{name}: keys differ from the schema's fields: missing "
                f"{sorted(set(fields) - set(hints))}, extra {sorted(set(hints) - set(fields))}"
            )
        if set(typed.__required_keys__) != set(fields):
            yield f"{name}: not every field is required: {sorted(typed.__optional_keys__)}"
        namespace = full_name.rpartition(".")[0]
        for field in node["fields"]:
            if field["name"] not in hints:
                continue
            expected = walker.expected(field["type"], namespace)
            declared = hints[field["name"]]
            if not _accepts(declared, expected):
                avro = _short(field["type"])
                yield f"{name}.{field['name']}: Avro {avro} is {expected}, not {declared}"


def _short(node: Any) -> str:
    """An Avro type as people write it, named types by name (not their whole definition)."""
    if isinstance(node, list):
        return "[" + ", ".join(_short(branch) for branch in node) + "]"
    if isinstance(node, str):
        return node
    if node["type"] in ("record", "enum", "fixed"):
        return str(node["name"])
    if node["type"] == "array":
        return f"array<{_short(node['items'])}>"
    if node["type"] == "map":
        return f"map<{_short(node['values'])}>"
    return str(node.get("logicalType", node["type"]))
