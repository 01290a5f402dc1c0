"""A schema's Avro binary writer, compiled once: the bytes fastavro writes, at a fraction of the CPU.

Why it exists: ``fastavro.schemaless_writer`` interprets the schema for every value. It
dispatches each field through its generic ``write_data`` and resolves each union by
validating the value against every branch; a ``MailEvent`` (50-odd fields, 20 unions) cost
36-44 µs per mail in the parse processes (measured on the bench's 4.7 KB mail, issue #29),
a quarter of a mail's whole parse. :func:`compile_writer` walks the parsed schema once and
generates straight-line Python, one function per record type, that writes into a
``bytearray`` (figures in the commits that brought and changed it).

fastavro stays the writer of record. The compiled writer takes only the value shapes the
events have and raises :class:`UnexpectedValue` for anything else, *before* its output is used:
a missing field (fastavro would write the default), another Python type, a symbol the enum
does not have (or ``UNRECOGNIZED``, which the serde refuses with its own sentence), a long
out of range, a string that is not UTF-8 encodable, tuple notation for a union. The caller
(:class:`~connectors.core.avro.serde.AvroSerde`) then hands that value to fastavro, which
writes it or raises its own error, so the outcome is always fastavro's. What it takes is
strictly less than fastavro accepts, so whenever it writes, fastavro would write the same
bytes; tests/unit/core/test_avro_writer.py checks that on generated events and on the
fixture mail corpora.

Schema constructs it compiles: records, enums, arrays, maps, ``null``, ``boolean``, ``int``,
``long``, ``string``, logical types on those (converted by fastavro's own ``LOGICAL_WRITERS``,
e.g. ``timestamp-millis`` from an aware datetime) and two-branch unions with ``null``. For
any other schema (bytes, floats, fixed, wider unions, recursive types)
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

from connectors.core.avro.errors import UnexpectedValue, UnsupportedSchema

__all__ = ["ValueWriter", "compile_writer"]

#: ``write(value) -> bytes``: the Avro binary encoding of ``value`` (no framing).
ValueWriter = Callable[[Any], bytes]

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
#: The readers' placeholder for a symbol they do not know: never written (serde.py says why).
_PLACEHOLDER = "UNRECOGNIZED"


def compile_writer(parsed: Any) -> ValueWriter | None:
    """The writer of ``parsed`` (a schema parsed by ``fastavro.parse_schema``), or None
    when the schema holds a construct this module does not compile."""
    named: dict[str, Any] = (
        dict(parsed.get("__named_schemas", {})) if isinstance(parsed, Mapping) else {}
    )
    try:
        node = _Compiler(named).compile(parsed)
    except UnsupportedSchema:
        return None

    def write(value: Any) -> bytes:
        out = bytearray()
        try:
            node(out, value)
        except (TypeError, KeyError, AttributeError, ValueError, OverflowError) as exc:
            # A value of another shape than the compiled one took (a list for a record, a
            # str subclass...): fastavro decides what it is.
            raise UnexpectedValue(repr(exc)) from exc
        return bytes(out)

    return write


def _long(out: bytearray, datum: Any) -> None:
    """A long that is not 0..8191 (the generated code writes those itself)."""
    if datum.__class__ is not int:
        raise UnexpectedValue("not a long")
    if not _LONG_MIN <= datum <= _LONG_MAX:
        raise UnexpectedValue("a long out of range")
    n = (datum << 1) ^ (datum >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _varint(n: int) -> bytes:
    out = bytearray()
    _long(out, n)
    return bytes(out)


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "string"})
#: The generated code writes a long in 0..63 as one byte and in 64..8191 as two (zig-zag
#: doubles a non-negative n; each varint byte holds 7 bits), without calling :func:`_long`.
#: Two-byte ones are most of a MailEvent's longs (the lengths of the text body, the URI and
#: the 64-digit hashes, the size, the UID: ~8 per bench mail); calling ``_long`` for them
#: took ~0.8 µs of the ~12 the bench mail's MailEvent takes to write.
_ONE_BYTE, _TWO_BYTES = 64, 8192


class _Compiler:
    """Generates the source of one function per record type and compiles it.

    Why generated code and not nested closures (the first version): a closure per schema node
    is a Python call per field, ~150 per MailEvent, which left the writer at half of
    fastavro's cost; straight-line code per record writes the same bytes with a call per
    record (MailEvent: 10.7 µs against fastavro's 40.7, the closures' 17.2 against 38.7, each
    pair measured side by side). The code is plain: each node below is a few lines, and the
    ``source`` attribute holds the whole of it once compiled.
    """

    def __init__(self, named: dict[str, Any]) -> None:
        self._named = named
        #: Names the generated code refers to: helpers, enum tables, logical converters.
        self._globals: dict[str, Any] = {
            "UnexpectedValue": UnexpectedValue,
            "_long": _long,
            "_LONG_MIN": _LONG_MIN,
            "_LONG_MAX": _LONG_MAX,
            "_INT_MIN": _INT_MIN,
            "_INT_MAX": _INT_MAX,
        }
        #: Record full name -> its function's name; a name seen but not yet finished is
        #: recursive (not compiled).
        self._functions: dict[str, str] = {}
        self._open: set[str] = set()
        self._sources: list[str] = []
        self._counter = 0
        #: The generated module, once :meth:`compile` ran (for a reader, or a debugger).
        self.source = ""

    def compile(self, schema: Any) -> Callable[[bytearray, Any], None]:
        lines: list[str] = []
        self._node(schema, "value", lines, 1)
        self._sources.append(_function("_write_top", lines))
        self.source = "\n\n".join(self._sources)
        namespace = dict(self._globals)
        # The source is this class's own text: schema strings enter it only through repr()
        # (field names) or as constants in ``namespace`` (enum tables, logical converters).
        exec(compile(self.source, "<mailtap avro writer>", "exec"), namespace)
        function: Callable[[bytearray, Any], None] = namespace["_write_top"]
        return function

    def _name(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _constant(self, prefix: str, value: Any) -> str:
        name = self._name(prefix)
        self._globals[name] = value
        return name

    def _node(self, schema: Any, var: str, lines: list[str], depth: int) -> None:
        """Append the statements that write ``var`` (a local of the generated function)."""
        pad = "    " * depth
        if isinstance(schema, list):
            self._union(schema, var, lines, depth)
            return
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                self._primitive(schema, var, lines, pad)
            elif schema in self._functions:
                lines.append(f"{pad}{self._functions[schema]}(out, {var})")
            elif schema in self._named and schema not in self._open:
                self._node(self._named[schema], var, lines, depth)
            else:
                raise UnsupportedSchema(f"recursive or unknown type {schema}")
            return
        if not isinstance(schema, dict):
            raise UnsupportedSchema(repr(schema))
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if logical is not None:
            prepare = LOGICAL_WRITERS.get(f"{kind}-{logical}")
            if prepare is None or kind not in _PRIMITIVES:
                raise UnsupportedSchema(f"logical type {logical} on {kind}")
            # fastavro's own conversion (a datetime to epoch milliseconds...): the same number.
            convert = self._constant("_prepare", prepare)
            node = self._constant("_schema", schema)
            lines.append(f"{pad}{var} = {convert}({var}, {node})")
            self._primitive(kind, var, lines, pad)
        elif kind == "record":
            self._record(schema, var, lines, pad)
        elif kind == "enum":
            symbols = {
                symbol: _varint(i)
                for i, symbol in enumerate(schema["symbols"])
                if symbol != _PLACEHOLDER
            }
            table = self._constant("_enum", symbols)
            found = self._name("e")
            lines += [
                f"{pad}{found} = {table}.get({var}) if {var}.__class__ is str else None",
                f"{pad}if {found} is None:",
                f"{pad}    raise UnexpectedValue('not a symbol of the enum')",
                f"{pad}out += {found}",
            ]
        elif kind in ("array", "map"):
            self._blocks(schema, var, lines, depth)
        elif isinstance(kind, str) and kind in _PRIMITIVES:
            self._primitive(kind, var, lines, pad)
        else:
            raise UnsupportedSchema(str(kind))

    def _blocks(self, schema: dict[str, Any], var: str, lines: list[str], depth: int) -> None:
        """An array or a map as fastavro writes it: one block (the count, then the items, or
        the string keys each with its value), then the 0 block; empty, the 0 block alone."""
        pad = "    " * depth
        item = self._name("item")
        key = None if schema["type"] == "array" else self._name("key")
        if key is None:
            accepted, shape = f"{var}.__class__ is list or {var}.__class__ is tuple", "list"
            loop = f"for {item} in {var}:"
        else:
            accepted, shape = f"{var}.__class__ is dict", "dict"
            loop = f"for {key}, {item} in {var}.items():"
        lines += [
            f"{pad}if not ({accepted}):",
            f"{pad}    raise UnexpectedValue('not a {shape}')",
            f"{pad}if {var}:",
        ]
        self._length(f"len({var})", lines, pad + "    ")
        lines.append(f"{pad}    {loop}")
        if key is not None:
            self._primitive("string", key, lines, pad + "        ")
        self._node(schema["items" if key is None else "values"], item, lines, depth + 2)
        lines.append(f"{pad}out.append(0)")

    def _primitive(self, kind: str, var: str, lines: list[str], pad: str) -> None:
        if kind == "null":
            lines += [f"{pad}if {var} is not None:", f"{pad}    raise UnexpectedValue('not None')"]
        elif kind == "boolean":
            lines += [
                f"{pad}if {var} is True:",
                f"{pad}    out.append(1)",
                f"{pad}elif {var} is False:",
                f"{pad}    out.append(0)",
                f"{pad}else:",
                f"{pad}    raise UnexpectedValue('not a bool')",
            ]
        elif kind == "string":
            data = self._name("data")
            lines += [
                f"{pad}if {var}.__class__ is not str:",
                f"{pad}    raise UnexpectedValue('not a str')",
                # Strict UTF-8 as fastavro: a lone surrogate raises UnicodeEncodeError.
                f"{pad}{data} = {var}.encode()",
            ]
            self._length(f"len({data})", lines, pad)
            lines.append(f"{pad}out += {data}")
        else:  # int, long
            lines += [
                f"{pad}if {var}.__class__ is not int:",
                f"{pad}    raise UnexpectedValue('not an int')",
            ]
            if kind == "int":
                lines += [
                    f"{pad}if not _INT_MIN <= {var} <= _INT_MAX:",
                    f"{pad}    raise UnexpectedValue('an int out of range')",
                ]
            self._varint(var, lines, pad, non_negative=False)

    def _length(self, expression: str, lines: list[str], pad: str) -> None:
        """Write ``expression``, a length (an int >= 0), as its varint."""
        n = self._name("n")
        lines.append(f"{pad}{n} = {expression}")
        self._varint(n, lines, pad, non_negative=True)

    @staticmethod
    def _varint(var: str, lines: list[str], pad: str, *, non_negative: bool) -> None:
        """Write the int ``var`` as a zig-zag varint: 0..63 and 64..8191 inline, the rest by
        :func:`_long`. ``non_negative``: ``var`` is known to be >= 0 (a length), so the
        ranges need no lower bound."""
        one, two = (
            (f"{var} < {_ONE_BYTE}", f"{var} < {_TWO_BYTES}")
            if non_negative
            else (f"0 <= {var} < {_ONE_BYTE}", f"{_ONE_BYTE} <= {var} < {_TWO_BYTES}")
        )
        lines += [
            f"{pad}if {one}:",
            f"{pad}    out.append({var} << 1)",
            f"{pad}elif {two}:",
            f"{pad}    out.append(({var} << 1) & 0x7F | 0x80)",
            f"{pad}    out.append({var} >> 6)",
            f"{pad}else:",
            f"{pad}    _long(out, {var})",
        ]

    def _record(self, schema: dict[str, Any], var: str, lines: list[str], pad: str) -> None:
        name = schema["name"]
        function = self._name("_write_record")
        self._open.add(name)
        body = [
            "    if value.__class__ is not dict:",
            "        raise UnexpectedValue('not a dict')",
        ]
        for field in schema["fields"]:
            local = self._name("f")
            # A missing key raises KeyError: fastavro writes the field's default.
            body.append(f"    {local} = value[{field['name']!r}]")
            self._node(field["type"], local, body, 1)
        self._open.discard(name)
        self._functions[name] = function
        self._sources.append(_function(function, body))
        lines.append(f"{pad}{function}(out, {var})")

    def _union(self, branches: list[Any], var: str, lines: list[str], depth: int) -> None:
        if len(branches) != 2 or "null" not in branches:
            raise UnsupportedSchema("a union other than [null, X]")
        pad = "    " * depth
        null_index = branches.index("null")
        lines += [
            f"{pad}if {var} is None:",
            f"{pad}    out.append({null_index << 1})",
            f"{pad}elif {var}.__class__ is tuple:",
            f"{pad}    raise UnexpectedValue('tuple notation')",  # fastavro resolves named branches
            f"{pad}else:",
            f"{pad}    out.append({(1 - null_index) << 1})",
        ]
        self._node(branches[1 - null_index], var, lines, depth + 1)


def _function(name: str, body: list[str]) -> str:
    return "\n".join([f"def {name}(out, value):", *body])
