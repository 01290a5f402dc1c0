"""The sink's typed values (connectors/core/avro/replies.py) and schemas/ReplyCommand.avsc and
DeliveryEvent.avsc say the same thing (tests/support/avro_types.py: keys, required, types), and
the sink's enums name only symbols of the schema."""

from __future__ import annotations

import types
from typing import get_args

import pytest

from connectors.core.avro import replies
from connectors.core.avro.schemas import load_schema
from connectors.smtp.bounce import BounceType
from connectors.smtp.classify import DeliveryStatus
from tests.support.avro_types import drift

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("schema", ["ReplyCommand", "DeliveryEvent"])
def test_sink_value_types_match_the_schema(schema: str) -> None:
    assert drift(load_schema(schema).raw, replies) == []


def test_each_record_of_the_sink_schemas_has_its_type() -> None:
    # Checked against a module without them, every record of both schemas is reported missing.
    empty = types.ModuleType("empty")
    missing = {
        problem.partition(":")[0].rpartition(".")[2]
        for schema in ("ReplyCommand", "DeliveryEvent")
        for problem in drift(load_schema(schema).raw, empty)
    }
    assert missing == {"ReplyCommand", "Address", "AttachmentRef", "DeliveryEvent"}


@pytest.mark.parametrize(
    ("enum", "symbols"),
    [(DeliveryStatus, replies.DeliveryStatusSymbol), (BounceType, replies.BounceTypeSymbol)],
)
def test_the_sink_enums_write_symbols_of_the_schema(enum: type, symbols: object) -> None:
    # Their .value is typed as the schema's Literal (``_value_``); hold the members to it.
    values = {member.value for member in enum}
    assert values <= set(get_args(symbols)) - {"UNRECOGNIZED"}
