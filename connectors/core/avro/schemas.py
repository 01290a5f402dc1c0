"""The Avro contract in ``schemas/``: loading, assembling and every version a reader may meet.

``schemas/`` holds one file per topic schema (``MailEvent.avsc``...) and one per named type that
several of them share (``io.mailtap.v1.Address.avsc``), defined there only: a code generator or a
parser that sees all files must meet each named type once ("Can't redefine" otherwise). The topic
files refer to a shared type by its full name. Parse order: the shared files first, then the
topic files in any order (the file name ``<full name>.avsc`` is also what fastavro's
``load_schema`` looks for when it meets an unknown name).

What goes on the wire (fingerprinted, registered) is each topic schema *assembled*: the shared
type's definition inlined at its first use, later uses by name, as Java's ``Schema.toString()``
prints a schema parsed after its dependencies. So every reader gets one self-contained schema
per topic and needs no schema references.

``schemas/history/<Name>.v<N>.avsc`` are the released versions, self-contained, kept so that
single-object readers find an old writer's schema by fingerprint and so the compatibility check
(tests/unit/core/test_schema_contract.py) compares the current files with every one of them.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

SchemaName = Literal["MailEvent", "ReplyCommand", "DeliveryEvent", "WorkflowEvent", "Suppression"]
#: The topic schemas, in the order tools list them.
TOPIC_SCHEMAS: tuple[str, ...] = get_args(SchemaName)
NAMESPACE = "io.mailtap.v1"
#: Named types defined in their own file because more than one topic schema uses them.
SHARED_TYPES: tuple[str, ...] = (f"{NAMESPACE}.Address",)
SCHEMAS_DIR_ENV = "MAILTAP_SCHEMAS_DIR"

_NAMED = ("record", "error", "enum", "fixed")


def schemas_dir() -> Path:
    """The folder of ``*.avsc`` files: ``$MAILTAP_SCHEMAS_DIR`` or the repository's ``schemas/``."""
    override = os.environ.get(SCHEMAS_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[3] / "schemas"


def parse_order(root: Path | None = None) -> list[Path]:
    """Every current schema file in an order any Avro parser accepts: shared types first."""
    root = root or schemas_dir()
    return [root / f"{name}.avsc" for name in SHARED_TYPES] + [
        root / f"{name}.avsc" for name in TOPIC_SCHEMAS
    ]


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def assemble(raw: dict[str, Any], shared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``raw`` with each shared type it names defined at its first use (depth-first, in field
    order, as Avro parsers define names) and referred to by name after that."""
    defined: set[str] = set()

    def walk(node: Any, namespace: str) -> Any:
        if isinstance(node, str):
            full = _full_name(node, namespace)
            if full in shared and full not in defined:
                defined.add(full)
                return walk(copy.deepcopy(shared[full]), namespace)
            return node
        if isinstance(node, list):
            return [walk(branch, namespace) for branch in node]
        if not isinstance(node, dict):
            return node
        kind = node.get("type")
        out = dict(node)
        if kind in _NAMED:
            namespace = node.get("namespace", namespace)
            defined.add(_full_name(node["name"], namespace))
            if kind in ("record", "error"):
                out["fields"] = [
                    {**field, "type": walk(field["type"], namespace)} for field in node["fields"]
                ]
        elif kind == "array":
            out["items"] = walk(node["items"], namespace)
        elif kind == "map":
            out["values"] = walk(node["values"], namespace)
        else:
            out["type"] = walk(kind, namespace)
        return out

    return dict(walk(raw, raw.get("namespace", "")))


@cache
def shared_types(root: Path) -> dict[str, dict[str, Any]]:
    """The shared named types defined in ``root`` (none in ``history/``), by full name."""
    found = {}
    for name in SHARED_TYPES:
        file = root / f"{name}.avsc"
        if not file.is_file():
            continue
        raw = json.loads(file.read_text(encoding="utf-8"))
        found[_full_name(raw["name"], raw.get("namespace", ""))] = raw
    return found


@dataclass(frozen=True)
class LoadedSchema:
    name: str
    raw: dict[str, Any]
    """The self-contained schema (JSON-ready), as registered and fingerprinted."""
    parsed: Any
    fingerprint: bytes
    """CRC-64-AVRO of the parsing canonical form, little-endian, as single-object encoding has it."""


@cache
def load_schema(name: str, path: Path | None = None) -> LoadedSchema:
    """Parse a schema once (fastavro advice); separate ``named_schemas`` per schema and version.

    A file of ``schemas/`` is assembled with the shared types it uses; a history file is
    self-contained already.
    """
    file = path or schemas_dir() / f"{name}.avsc"
    raw = json.loads(file.read_text(encoding="utf-8"))
    shared = shared_types(file.parent)
    raw = assemble(raw, shared) if shared else raw
    parsed = fastavro.parse_schema(raw, named_schemas={})
    canonical = to_parsing_canonical_form(parsed)
    return LoadedSchema(name, raw, parsed, bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")))


def history_files(root: Path | None = None) -> list[Path]:
    """Released versions, ``history/<Name>.v<N>.avsc``, sorted by name then version."""
    root = root or schemas_dir()

    def version(path: Path) -> tuple[str, int]:
        name, _, number = path.stem.rpartition(".v")
        return name, int(number)

    return sorted((root / "history").glob("*.v*.avsc"), key=version)


@cache
def known_writers() -> dict[bytes, LoadedSchema]:
    """Every schema version we can read, by fingerprint: the current topic schemas and history."""
    found: dict[bytes, LoadedSchema] = {}
    for file in history_files():
        loaded = load_schema(file.stem, file)
        found[loaded.fingerprint] = loaded
    for name in TOPIC_SCHEMAS:
        loaded = load_schema(name)
        found[loaded.fingerprint] = loaded
    return found
