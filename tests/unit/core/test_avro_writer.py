"""The compiled Avro writer (connectors/core/avro/writer.py) against fastavro, the writer of record.

Whatever the compiled writer writes must be fastavro's bytes; whatever it refuses
(``UnexpectedValue``) the serde hands to fastavro, so ``AvroSerde.encode`` must give fastavro's
bytes, or fastavro's error, for every value: events parsed from the fixture corpora (hostile
mail included), events generated from the schema itself, and values of the wrong shape.
"""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.core.avro.errors import UnexpectedValue
from connectors.core.avro.serde import SINGLE_OBJECT_MAGIC, TOPIC_SCHEMAS, AvroSerde, load_schema
from connectors.core.avro.writer import compile_writer
from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.errors import DataError
from connectors.core.mail import ParseLimits, parse_mail

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
MAIL_EVENT = load_schema("MailEvent")


def fastavro_bytes(parsed: Any, value: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, value)
    return buffer.getvalue()


def fastavro_outcome(parsed: Any, value: Any) -> bytes | type[BaseException]:
    try:
        return fastavro_bytes(parsed, value)
    except Exception as exc:  # the error type is the outcome compared
        return type(exc)


def serde_outcome(serde: AvroSerde, value: Any) -> bytes | type[BaseException]:
    try:
        encoded = serde.encode(value, "mail.events")
    except Exception as exc:
        return type(exc)
    assert encoded[:10] == SINGLE_OBJECT_MAGIC + serde.schema.fingerprint
    return encoded[10:]


# --- hostile and ordinary mail, parsed ----------------------------------------------------------


def _hostile_mails() -> list[bytes]:
    deep = b"".join(
        b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i)
        for i in range(120)
    )
    return [
        b"Subject: " + b"=?utf-8?b?w6k=?= " * 3000 + b"\r\n\r\nbody\r\n",
        b"From: " + b", ".join(b"u%d@example.com" % i for i in range(3000)) + b"\r\n\r\nx",
        b"Message-ID: <a@b>\r\n" + deep + b"Content-Type: text/plain\r\n\r\ndeep\r\n",
        b"Subject: \xff\xfe\x00 bad bytes\r\nFrom: \xe9 <x@y>\r\n\r\n\x00\xff body",
        b"Content-Type: text/plain; " + b"; ".join(b"p%d=v" % i for i in range(500)) + b"\r\n\r\n",
        b"no header block at all",
        b"",
    ]


def _corpus() -> list[tuple[str, bytes]]:
    files = sorted(p for d in ("mail", "dsn", "arf") for p in (FIXTURES / d).glob("*.eml"))
    assert len(files) >= 20, "the fixture corpora moved"
    named = [(p.name, p.read_bytes()) for p in files]
    return named + [(f"hostile-{i}", raw) for i, raw in enumerate(_hostile_mails())]


@pytest.mark.parametrize(("name", "raw"), _corpus(), ids=[n for n, _ in _corpus()])
def test_parsed_mail_encodes_to_fastavros_bytes(name: str, raw: bytes, tmp_path: Path) -> None:
    write = compile_writer(MAIL_EVENT.parsed)
    assert write is not None
    store = LocalClaimCheckStore(tmp_path)
    parsed = parse_mail(
        raw,
        account="ops",
        source={"kind": "IMAP", "folder": "INBOX", "uidvalidity": 3, "uid": 2**40, "modseq": 7},
        flags=["\\Seen", "$Label1"],
        internal_date=NOW,
        observed_at=NOW,
        limits=ParseLimits(max_attachments=50),
        claim_check=store,
    )
    expected = fastavro_bytes(MAIL_EVENT.parsed, parsed.event)
    assert write(parsed.event) == expected
    serde = AvroSerde(MAIL_EVENT)
    assert serde.encode(parsed.event, "mail.events") == SINGLE_OBJECT_MAGIC + (
        MAIL_EVENT.fingerprint + expected
    )


# --- values generated from the schema -----------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8"), max_size=20)
_INTS = st.integers(-(2**31), 2**31 - 1)
_MOMENTS = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)
) | st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(3000, 1, 1))
#: Values at and past the edges, now and then: a lone surrogate, longs out of range.
_ODD_TEXT = _TEXT | st.sampled_from(["", "é", "\ud800"])
_ODD_INTS = _INTS | st.sampled_from([-(2**63), 2**63 - 1, 2**63, 2**70])


def _values(schema: Any, named: dict[str, Any], odd: bool) -> st.SearchStrategy[Any]:
    """Values of ``schema`` (a fastavro-parsed one); with ``odd``, now and then past its edges."""
    ints, text = (_ODD_INTS, _ODD_TEXT) if odd else (_INTS, _TEXT)
    if isinstance(schema, list):
        return st.one_of(*(_values(branch, named, odd) for branch in schema))
    if isinstance(schema, str):
        if schema in named:
            return _values(named[schema], named, odd)
        return {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": ints,
            "long": ints,
            "string": text,
        }[schema]
    kind = schema["type"]
    if schema.get("logicalType") == "timestamp-millis":
        return _MOMENTS | ints
    if kind == "record":
        fields = {f["name"]: _values(f["type"], named, odd) for f in schema["fields"]}
        return st.fixed_dictionaries(fields)
    if kind == "enum":
        symbols = (
            schema["symbols"] if odd else [s for s in schema["symbols"] if s != "UNRECOGNIZED"]
        )
        return st.sampled_from(symbols)
    if kind == "array":
        return st.lists(_values(schema["items"], named, odd), max_size=3)
    if kind == "map":
        keys = text | st.sampled_from([1, b"k"]) if odd else text
        return st.dictionaries(keys, _values(schema["values"], named, odd), max_size=3)
    return _values(kind, named, odd)


_ODD = st.sampled_from([1.5, b"bytes", ("io.mailtap.v1.Address", {}), [], {}, True, "nope"])


def _mangled(event: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """An event with one field dropped or given an odd value (fastavro's rules decide)."""

    @st.composite
    def mangle(draw: st.DrawFn) -> dict[str, Any]:
        value = dict(draw(event))
        name = draw(st.sampled_from(sorted(value)))
        if draw(st.booleans()):
            del value[name]
        else:
            value[name] = draw(_ODD)
        return value

    return mangle()


_NAMED = dict(MAIL_EVENT.parsed["__named_schemas"])
_EVENTS = _values(MAIL_EVENT.parsed, _NAMED, odd=False)
_ODD_EVENTS = _values(MAIL_EVENT.parsed, _NAMED, odd=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_EVENTS, _ODD_EVENTS, _mangled(_EVENTS)))
def test_any_value_gives_fastavros_outcome(value: dict[str, Any]) -> None:
    write = compile_writer(MAIL_EVENT.parsed)
    assert write is not None
    try:
        compiled = write(value)
    except UnexpectedValue:
        compiled = None
    if compiled is not None:
        assert compiled == fastavro_bytes(MAIL_EVENT.parsed, value)
    serde = AvroSerde(MAIL_EVENT)
    outcome = serde_outcome(serde, value)
    if isinstance(outcome, bytes) or outcome is not DataError:
        # DataError is the serde's own refusal of UNRECOGNIZED, before fastavro sees it.
        assert outcome == fastavro_outcome(MAIL_EVENT.parsed, serde._with_branches(value))


def test_the_generated_events_mostly_take_the_compiled_path() -> None:
    """The property above would hold trivially if every value were refused: values within
    the schema's edges all take the compiled writer."""
    write = compile_writer(MAIL_EVENT.parsed)
    assert write is not None
    taken: list[bool] = []

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_EVENTS)
    def count(value: dict[str, Any]) -> None:
        try:
            write(value)
            taken.append(True)
        except UnexpectedValue:
            taken.append(False)

    count()
    assert taken and all(taken)


WORKFLOW_EVENT = load_schema("WorkflowEvent")
_WORKFLOW_EVENTS = _values(WORKFLOW_EVENT.parsed, {}, odd=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_WORKFLOW_EVENTS, _values(WORKFLOW_EVENT.parsed, {}, odd=True)))
def test_a_workflow_event_and_its_map_give_fastavros_outcome(value: dict[str, Any]) -> None:
    """WorkflowEvent's ``attributes`` is a map: the compiled writer writes fastavro's bytes
    (one block of pairs, then the 0 block), or refuses and the serde gives fastavro's."""
    write = compile_writer(WORKFLOW_EVENT.parsed)
    assert write is not None
    try:
        compiled = write(value)
    except UnexpectedValue:
        compiled = None
    else:
        assert compiled == fastavro_bytes(WORKFLOW_EVENT.parsed, value)
    outcome = serde_outcome(AvroSerde(WORKFLOW_EVENT), value)
    assert outcome == fastavro_outcome(WORKFLOW_EVENT.parsed, value)


def test_workflow_events_with_attributes_take_the_compiled_path() -> None:
    write = compile_writer(WORKFLOW_EVENT.parsed)
    assert write is not None
    event = {
        "schema_version": 1,
        "instance_id": "T-1",
        "workflow": "ticket_intake",
        "status": "SKIPPED",
        "event_key": "ops/mid:a@b",
        "attributes": {"guard": "rate_limit", "reason": "é" * 70, "": ""},
        "occurred_at": NOW,
    }
    assert write(event) == fastavro_bytes(WORKFLOW_EVENT.parsed, event)
    assert write({**event, "attributes": {}}) == fastavro_bytes(
        WORKFLOW_EVENT.parsed, {**event, "attributes": {}}
    )


def test_the_placeholder_symbol_is_refused_as_before() -> None:
    event = {**_plain_event(), "change": "UNRECOGNIZED"}
    with pytest.raises(DataError, match="UNRECOGNIZED"):
        AvroSerde(MAIL_EVENT).encode(event, "mail.events")


def test_a_missing_field_with_a_default_is_written_by_fastavro() -> None:
    event = _plain_event()
    del event["schema_version"]  # default 1
    write = compile_writer(MAIL_EVENT.parsed)
    assert write is not None
    with pytest.raises(UnexpectedValue):
        write(event)
    assert AvroSerde(MAIL_EVENT).encode(event, "mail.events")[10:] == fastavro_bytes(
        MAIL_EVENT.parsed, event
    )


@pytest.mark.parametrize("name", TOPIC_SCHEMAS)
def test_every_topic_schema_compiles_or_keeps_fastavro(name: Any) -> None:
    """A schema the compiler does not take gives None (fastavro), never a wrong writer."""
    schema = load_schema(name)
    write = compile_writer(schema.parsed)
    if write is None:
        assert AvroSerde(schema)._writer is None
        return
    assert AvroSerde(schema)._writer is not None


def test_the_hot_schemas_compile() -> None:
    """MailEvent is written once per mail (ReplyCommand, DeliveryEvent once per reply,
    WorkflowEvent once per workflow step): a schema change that made them fall back to fastavro would cost ~30 µs per mail unseen."""
    for name in ("MailEvent", "ReplyCommand", "DeliveryEvent", "WorkflowEvent"):
        assert compile_writer(load_schema(name).parsed) is not None, name


_EDGES = (0, 1, 63, 64, 65, 127, 128, 8191, 8192, 8193, 2**20)


@pytest.mark.parametrize("n", _EDGES + tuple(-n for n in _EDGES if n) + (2**63 - 1, -(2**63)))
def test_longs_and_lengths_at_the_varint_edges_are_fastavros(n: int) -> None:
    """The generated code writes one- and two-byte varints itself and calls ``_long`` past
    them: at each edge the bytes are fastavro's (lengths of ASCII and of 2-byte UTF-8 text,
    and an array's count)."""
    schema = fastavro.parse_schema(
        {
            "type": "record",
            "name": "Edges",
            "fields": [
                {"name": "n", "type": "long"},
                {"name": "i", "type": ["null", "int"]},
                {"name": "ascii", "type": "string"},
                {"name": "utf8", "type": ["null", "string"]},
                {"name": "items", "type": {"type": "array", "items": "null"}},
            ],
        }
    )
    write = compile_writer(schema)
    assert write is not None
    length = min(abs(n), 2**14)
    value = {
        "n": n,
        "i": n if -(2**31) <= n < 2**31 else None,
        "ascii": "a" * length,
        "utf8": "é" * (length // 2),
        "items": [None] * length,
    }
    assert write(value) == fastavro_bytes(schema, value)


def test_constructs_it_does_not_compile() -> None:
    for schema in (
        {"type": "map", "values": "bytes"},
        {"type": "record", "name": "F", "fields": [{"name": "f", "type": "double"}]},
        ["null", "string", "long"],
        {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
    ):
        assert compile_writer(fastavro.parse_schema(schema)) is None, schema


def _plain_event() -> dict[str, Any]:
    parsed = parse_mail(
        b"Message-ID: <1@example.com>\r\nFrom: Ann <ann@example.com>\r\n\r\nhi\r\n",
        account="ops",
        source={"kind": "IMAP", "folder": "INBOX"},
        flags=[],
        internal_date=None,
        observed_at=NOW,
    )
    return dict(parsed.event)
