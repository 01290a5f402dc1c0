"""The contract in schemas/: valid in every Avro stack, each named type once, documented, and
compatible both ways with every released version in schemas/history/.

Compatibility is Avro's schema resolution (the specification's rules) as the Apache ``avro``
package implements it (``avro.compatibility``, a port of Java's SchemaCompatibility), checked in
both directions: BACKWARD (the current schema reads what a released version wrote) and FORWARD
(a released version reads what the current schema writes) — FULL_TRANSITIVE. The JVM test
(tests/integration/core/test_java_avro.py) repeats it with Java's own SchemaCompatibility.

The one documented exception (schemas/README.md, "Compatibility"): the first released version,
v1, had no default on its enums, so a v1 reader cannot resolve the placeholder symbol
``UNRECOGNIZED`` that the current enums add as their default. mailtap never writes that symbol
(it exists for readers; the serde refuses to write it), so real records stay readable by v1
readers: against v1, the FORWARD check takes the current schema without that symbol, as writers
use it. Every other check, and every later version, is checked as is.
"""

from __future__ import annotations

import io
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import fastavro
import fastavro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from connectors.core.avro.schemas import (
    NAMESPACE,
    TOPIC_SCHEMAS,
    history_files,
    parse_order,
    schemas_dir,
)
from tests.unit.core.contract_samples import (
    PLACEHOLDER,
    SAMPLES,
    current,
    definitions,
    without_placeholder,
)


def default_problems(schema: dict[str, Any]) -> list[str]:
    """Field defaults that Avro 1.9+ (Java), hamba/avro and Apicurio reject: a union's default
    must match its first branch (Avro specification, "Unions")."""
    problems = []
    seen: set[str] = set()

    def walk(node: avro.schema.Schema) -> None:
        if isinstance(node, avro.schema.RecordSchema):
            if node.fullname in seen:
                return
            seen.add(node.fullname)
            for f in node.fields:
                if f.has_default:
                    target = f.type
                    if isinstance(target, avro.schema.UnionSchema):
                        target = target.schemas[0]
                    if not avro.io.validate(target, f.default):
                        problems.append(f"{node.fullname}.{f.name}: default {f.default!r} invalid")
                walk(f.type)
        elif isinstance(node, avro.schema.UnionSchema):
            for branch in node.schemas:
                walk(branch)
        elif isinstance(node, avro.schema.ArraySchema):
            walk(node.items)
        elif isinstance(node, avro.schema.MapSchema):
            walk(node.values)

    walk(avro.schema.make_avsc_object(schema))
    return problems


def doc_problems(schema: dict[str, Any]) -> list[str]:
    problems = []
    for name, node in definitions(schema, schema.get("namespace", "")):
        if not node.get("doc"):
            problems.append(f"{name}: no doc")
        for field in node.get("fields", []):
            if not field.get("doc"):
                problems.append(f"{name}.{field['name']}: no doc")
        if node["type"] == "enum":
            for symbol in node["symbols"]:
                if not re.search(rf"\b{symbol}:", node.get("doc", "")):
                    problems.append(f"{name}: doc does not explain symbol {symbol}")
            if node.get("default") != PLACEHOLDER or node["symbols"][-1] != PLACEHOLDER:
                problems.append(f"{name}: default must be the last symbol, {PLACEHOLDER}")
    return problems


def compatibility_problems(reader: dict[str, Any], writer: dict[str, Any]) -> list[str]:
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.make_avsc_object(reader), avro.schema.make_avsc_object(writer)
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = sorted({kind.name for kind in result.incompatibilities})
    return [f"{', '.join(kinds)} {'; '.join(sorted(result.messages))}"]


def history_problems(root: Path) -> list[str]:
    problems = []
    schemas = current(root)
    for file in history_files(root):
        name, _, version = file.stem.rpartition(".v")
        old = json.loads(file.read_text())
        new = schemas[name]
        # The one-time exception (module docstring): v1 readers are checked against what
        # mailtap writes, the current schema without the reader-only placeholder symbol.
        written = without_placeholder(new) if version == "1" else new
        for direction, reader, writer in (("BACKWARD", new, old), ("FORWARD", old, written)):
            problems += [
                f"{name} vs {file.name} {direction}: {p}"
                for p in compatibility_problems(reader, writer)
            ]
    return problems


def contract_problems(root: Path) -> list[str]:
    raws = [json.loads(f.read_text()) for f in parse_order(root)]
    counts = Counter(name for raw in raws for name, _ in definitions(raw, raw["namespace"]))
    problems = [f"{n} is defined {c} times" for n, c in counts.items() if c != 1]
    for raw in raws:
        problems += doc_problems(raw)
    for schema in current(root).values():
        problems += default_problems(schema)
    return problems + history_problems(root)


def test_the_schemas_keep_the_contract() -> None:
    assert contract_problems(schemas_dir()) == []


def test_every_released_version_is_in_history() -> None:
    names = {f.stem.rpartition(".v")[0] for f in history_files()}
    assert names == set(TOPIC_SCHEMAS)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(schemas_dir(), tmp_path / "schemas")
    return tmp_path / "schemas"


def edit(root: Path, name: str, change: Any) -> None:
    file = root / f"{name}.avsc"
    raw = json.loads(file.read_text())
    change(raw)
    file.write_text(json.dumps(raw))


def field(raw: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in raw["fields"] if f["name"] == name)


@pytest.mark.parametrize(
    ("name", "change", "expected"),
    [
        # A type change: neither direction resolves.
        ("MailEvent", lambda r: field(r, "size").update(type="string"), "BACKWARD: type_mismatch"),
        # A new field without a default: today's reader cannot read v1 records.
        (
            "WorkflowEvent",
            lambda r: r["fields"].append({"name": "tenant", "type": "string", "doc": "t"}),
            "BACKWARD: reader_field_missing_default_value tenant",
        ),
        # A removed field that v1 readers need (it has no default there).
        (
            "DeliveryEvent",
            lambda r: r["fields"].remove(field(r, "command_id")),
            "FORWARD: reader_field_missing_default_value command_id",
        ),
        # A new enum symbol other than the placeholder: v1 readers have no default for it.
        (
            "ReplyCommand",
            lambda r: field(r, "kind")["type"]["symbols"].insert(3, "BOUNCE"),
            "'BOUNCE'",
        ),
        # The v1 bug the issue reports: a union default that is not of the first branch.
        (
            "ReplyCommand",
            lambda r: field(r, "auto_submitted").update(type=["null", "string"]),
            "ReplyCommand.auto_submitted: default 'auto-replied' invalid",
        ),
        # Address defined inline again (the code generator's "Can't redefine").
        (
            "ReplyCommand",
            lambda r: field(r, "from").update(
                type=json.loads((schemas_dir() / f"{NAMESPACE}.Address.avsc").read_text())
            ),
            f"{NAMESPACE}.Address is defined 2 times",
        ),
        # An undocumented field.
        ("WorkflowEvent", lambda r: field(r, "status").pop("doc"), "WorkflowEvent.status: no doc"),
    ],
)
def test_a_breaking_change_in_a_copy_fails_the_check(
    copy: Path, name: str, change: Any, expected: str
) -> None:
    assert contract_problems(copy) == []
    edit(copy, name, change)
    problems = contract_problems(copy)
    assert any(expected in p for p in problems), problems


def test_assembled_schemas_equal_what_fastavro_loads_from_the_files() -> None:
    """``fastavro.schema.load_schema("schemas/MailEvent.avsc")`` (the Python snippet of the
    README) finds io.mailtap.v1.Address.avsc by its name and yields the same schema."""
    for name, schema in current(schemas_dir()).items():
        loaded = fastavro.schema.load_schema(str(schemas_dir() / f"{name}.avsc"))
        ours = fastavro.parse_schema(schema, named_schemas={})
        assert fastavro.schema.to_parsing_canonical_form(loaded) == (
            fastavro.schema.to_parsing_canonical_form(ours)
        )


def test_one_parser_takes_every_file_in_the_documented_order() -> None:
    """What a code generator does: all files through one parser, shared types first."""
    names = avro.schema.Names()
    parsed = [avro.schema.make_avsc_object(json.loads(f.read_text()), names) for f in parse_order()]
    assert [p.fullname for p in parsed][1:] == [f"{NAMESPACE}.{n}" for n in TOPIC_SCHEMAS]


def roundtrip(record: dict[str, Any], writer: dict[str, Any], reader: dict[str, Any]) -> Any:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(writer, named_schemas={}), record)
    out.seek(0)
    return fastavro.schemaless_reader(
        out,
        fastavro.parse_schema(writer, named_schemas={}),
        fastavro.parse_schema(reader, named_schemas={}),
    )


@pytest.mark.parametrize("file", history_files(), ids=lambda f: f.name)
def test_real_records_resolve_both_ways_with_each_released_version(file: Path) -> None:
    name = file.stem.rpartition(".v")[0]
    old = json.loads(file.read_text())
    new = current(schemas_dir())[name]
    record = SAMPLES[name]()
    added = {f["name"]: f for f in new["fields"]}.keys() - {f["name"] for f in old["fields"]}
    known = {k: v for k, v in record.items() if k not in added}
    assert roundtrip(record, new, old) == known  # an old reader, today's writer
    back = roundtrip(known, old, new)  # today's reader, an old writer
    assert {k: v for k, v in back.items() if k not in added} == known
    defaults = {f["name"]: f["default"] for f in new["fields"] if f["name"] in added}
    assert {k: back[k] for k in added} == defaults  # fields added since take their default


def test_a_symbol_unknown_to_the_reader_becomes_the_placeholder() -> None:
    """What the enum defaults are for: a future writer's new symbol reaches today's reader as
    UNRECOGNIZED, never as a real symbol (v1's ChangeKind turned it into ADDED)."""
    new = current(schemas_dir())["MailEvent"]
    future = json.loads(json.dumps(new))
    field(future, "change")["type"]["symbols"].append("DELETED")
    record = dict(SAMPLES["MailEvent"](), change="DELETED")
    assert roundtrip(record, future, new)["change"] == PLACEHOLDER
