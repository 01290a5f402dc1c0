"""A schema's Avro binary writer, compiled once: the bytes fastavro writes, for a fifth of the CPU.

Why it exists: ``fastavro.schemaless_writer`` interprets the schema for every value. It
dispatches each field through its generic ``write_data`` and resolves each union by
validating the value against every branch; a ``MailEvent`` (50-odd fields, 20 unions) cost
36-44 µs per mail in the parse processes (measured on the bench's 4.7 KB mail, issue #29),
a quarter of a mail's whole parse. :func:`compile_writer` walks the parsed schema once and
returns nested closures, one per schema node, that write straight into a ``bytearray``
(~8 µs for the same event).

fastavro stays the writer of record. The compiled writer takes only the value shapes the
events have and raises :class:`Unexpected` for anything else, *before* its output is used:
a missing field (fastavro would write the default), another Python type, a symbol the enum
does not have (or ``UNRECOGNIZED``, which the serde refuses with its own sentence), a long
out of range, a string that is not UTF-8 encodable, tuple notation for a union. The caller
(:class:`~connectors.core.avro.serde.AvroSerde`) then hands that value to fastavro, which
writes it or raises its own error, so the outcome is always fastavro's. What it takes is
strictly less than fastavro accepts, so whenever it writes, fastavro would write the same
bytes; tests/unit/core/test_avro_writer.py checks that on generated events and on the
fixture mail corpora.

Schema constructs it compiles: records, enums, arrays, ``null``, ``boolean``, ``int``,
``long``, ``string``, logical types on those (converted by fastavro's own ``LOGICAL_WRITERS``,
e.g. ``timestamp-millis`` from an aware datetime) and two-branch unions with ``null``. For
any other schema (maps, bytes, floats, fixed, wider unions, recursive types)
:func:`compile_writer` returns None and the serde keeps fastavro for it.

>>> from fastavro import parse_schema
>>> schema = parse_schema({"type": "record", "name": "R", "fields": [
...     {"name": "n", "type": "long"}, {"name": "s", "type": ["null", "string"]}]})
>>> write = compile_writer(schema)
>>> write({"n": -1, "s": "hé"}).hex()
'01020668c3a9'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastavro.write import LOGICAL_WRITERS

__all__ = ["Unexpected", "ValueWriter", "compile_writer"]

#: ``write(value) -> bytes``: the Avro binary encoding of ``value`` (no framing).
ValueWriter = Callable[[Any], bytes]
_Node = Callable[[bytearray, Any], None]

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
#: The readers' placeholder for a symbol they do not know: never written (serde.py says why).
_PLACEHOLDER = "UNRECOGNIZED"
#: The zig-zag varint of 0..63 and -64..-1, one byte each: most lengths and union indexes.
_SMALL = {n: bytes([(n << 1) ^ (n >> 63)]) for n in range(-64, 64)}


class Unexpected(Exception):
    """The value is not one the compiled writer takes; write it with fastavro instead."""


class _Unsupported(Exception):
    """A schema construct the compiler does not take (compile_writer returns None)."""


def compile_writer(parsed: Any) -> ValueWriter | None:
    """The writer of ``parsed`` (a schema parsed by ``fastavro.parse_schema``), or None
    when the schema holds a construct this module does not compile."""
    named: dict[str, Any] = (
        dict(parsed.get("__named_schemas", {})) if isinstance(parsed, Mapping) else {}
    )
    try:
        node = _Compiler(named).node(parsed)
    except _Unsupported:
        return None

    def write(value: Any) -> bytes:
        out = bytearray()
        try:
            node(out, value)
        except (TypeError, KeyError, AttributeError, ValueError, OverflowError) as exc:
            # A value of another shape than the compiled one took (a list for a record, a
            # str subclass...): fastavro decides what it is.
            raise Unexpected(repr(exc)) from exc
        return bytes(out)

    return write


def _long(out: bytearray, datum: Any) -> None:
    if datum.__class__ is not int:
        raise Unexpected("not a long")
    if 0 <= datum < 64:  # most lengths and numbers: one byte, 2n
        out.append(datum << 1)
        return
    if not _LONG_MIN <= datum <= _LONG_MAX:
        raise Unexpected("a long out of range")
    n = (datum << 1) ^ (datum >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _int(out: bytearray, datum: Any) -> None:
    if datum.__class__ is not int or not _INT_MIN <= datum <= _INT_MAX:
        raise Unexpected("not an int")
    _long(out, datum)


def _string(out: bytearray, datum: Any) -> None:
    if datum.__class__ is not str:
        raise Unexpected("not a str")
    # Strict UTF-8, as fastavro: a lone surrogate raises UnicodeEncodeError (-> fastavro).
    data = datum.encode()
    size = len(data)
    if size < 64:
        out.append(size << 1)
    else:
        _long(out, size)
    out += data


def _boolean(out: bytearray, datum: Any) -> None:
    if datum is True:
        out.append(1)
    elif datum is False:
        out.append(0)
    else:
        raise Unexpected("not a bool")


def _null(_out: bytearray, datum: Any) -> None:
    if datum is not None:
        raise Unexpected("not None")


_PRIMITIVES: dict[str, _Node] = {
    "null": _null,
    "boolean": _boolean,
    "int": _int,
    "long": _long,
    "string": _string,
}


class _Compiler:
    def __init__(self, named: dict[str, Any]) -> None:
        self._named = named
        self._compiled: dict[str, _Node] = {}
        self._open: set[str] = set()

    def node(self, schema: Any) -> _Node:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema]
            return self._named_node(schema)
        if isinstance(schema, list):
            return self._union(schema)
        if not isinstance(schema, dict):
            raise _Unsupported(repr(schema))
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if logical is not None:
            return self._logical(schema, logical)
        if kind == "record":
            return self._record(schema)
        if kind == "enum":
            return self._enum(schema)
        if kind == "array":
            return self._array(schema)
        if isinstance(kind, str) and kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        raise _Unsupported(str(kind))

    def _named_node(self, name: str) -> _Node:
        if name in self._compiled:
            return self._compiled[name]
        if name in self._open or name not in self._named:
            raise _Unsupported(f"recursive or unknown type {name}")
        return self.node(self._named[name])

    def _logical(self, schema: dict[str, Any], logical: str) -> _Node:
        base = schema["type"]
        prepare = LOGICAL_WRITERS.get(f"{base}-{logical}")
        if prepare is None or base not in _PRIMITIVES:
            raise _Unsupported(f"logical type {logical} on {base}")
        write_base = _PRIMITIVES[base]

        def logical_node(out: bytearray, datum: Any) -> None:
            # fastavro's own conversion (a datetime to epoch milliseconds...): the same number.
            write_base(out, prepare(datum, schema))

        return logical_node

    def _record(self, schema: dict[str, Any]) -> _Node:
        name = schema["name"]
        self._open.add(name)
        fields = tuple((f["name"], self.node(f["type"])) for f in schema["fields"])
        self._open.discard(name)

        def record_node(out: bytearray, datum: Any) -> None:
            if datum.__class__ is not dict:
                raise Unexpected("not a dict")
            for field_name, write_field in fields:
                write_field(out, datum[field_name])  # KeyError: fastavro writes the default

        self._compiled[name] = record_node
        return record_node

    def _enum(self, schema: dict[str, Any]) -> _Node:
        index = {
            symbol: _SMALL.get(i) or _varint(i)
            for i, symbol in enumerate(schema["symbols"])
            if symbol != _PLACEHOLDER
        }

        def enum_node(out: bytearray, datum: Any) -> None:
            encoded = index.get(datum) if datum.__class__ is str else None
            if encoded is None:
                raise Unexpected("not a symbol of the enum")
            out += encoded

        self._compiled[schema["name"]] = enum_node
        return enum_node

    def _array(self, schema: dict[str, Any]) -> _Node:
        write_item = self.node(schema["items"])

        def array_node(out: bytearray, datum: Any) -> None:
            if datum.__class__ is not list and datum.__class__ is not tuple:
                raise Unexpected("not a list")
            if datum:  # one block, as fastavro writes it: count, items, then the 0 block
                _long(out, len(datum))
                for item in datum:
                    write_item(out, item)
            out.append(0)

        return array_node

    def _union(self, branches: list[Any]) -> _Node:
        if len(branches) != 2 or "null" not in branches:
            raise _Unsupported("a union other than [null, X]")
        null_index = branches.index("null")
        other = self.node(branches[1 - null_index])
        null_tag, other_tag = _SMALL[null_index], _SMALL[1 - null_index]

        def union_node(out: bytearray, datum: Any) -> None:
            if datum is None:
                out += null_tag
            elif datum.__class__ is tuple:
                raise Unexpected("tuple notation")  # fastavro resolves the named branch
            else:
                out += other_tag
                other(out, datum)

        return union_node


def _varint(n: int) -> bytes:
    out = bytearray()
    _long(out, n)
    return bytes(out)
