"""The pure parts of ``mailtap soak --secure``: the broker properties of the instances'
listeners, the ACLs wanted per principal, and the refusals read from the authorizer log."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.core.config import config_from_dict
from mailtap.acls import component_acls
from mailtap.dev import scenario
from mailtap.dev.kafka import set_properties
from mailtap.dev.secure import PRINCIPALS, mtls_section, sasl_section
from mailtap.dev.secure_acls import bindings
from mailtap.dev.tcp_proxy import TcpProxy
from mailtap.soak.secured import SecuredStack, denied_operations, instance_bindings, make_stack
from mailtap.soak.stack import Stack, add_listeners

# Two lines as Kafka 4.1's StandardAuthorizer writes them (kafka.authorizer.logger).
DENIED_SINK = (
    "[2026-12-06 07:01:02,345] INFO Principal = User:mailtap-smtp-sink is Denied operation = "
    "WRITE from host = 127.0.0.1 on resource = Topic:LITERAL:mail.delivery for request = "
    "Produce with resourceRefCount = 1 based on rule DefaultDeny"
)
DENIED_OTHER = (
    "[2026-12-06 07:01:03,000] INFO Principal = User:someone-else is Denied operation = "
    "READ from host = 127.0.0.1 on resource = Topic:LITERAL:mail.events for request = "
    "Fetch with resourceRefCount = 1 based on rule DefaultDeny"
)


def test_refusals_of_our_principals_are_read_from_the_authorizer_log() -> None:
    text = "\n".join(["[2026-12-06 07:00:00,000] INFO something else", DENIED_SINK, DENIED_OTHER])
    found = denied_operations(text, set(PRINCIPALS.values()))
    assert list(found) == ["mailtap-smtp-sink"]
    assert found["mailtap-smtp-sink"] == [
        "WRITE from host = 127.0.0.1 on resource = Topic:LITERAL:mail.delivery for request = "
        "Produce with resourceRefCount = 1 based on rule DefaultDeny"
    ]
    assert denied_operations("", set(PRINCIPALS.values())) == {}


def test_a_property_is_set_in_place_or_appended(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text("# auto.create.topics.enable=true\nauto.create.topics.enable=true\nx=1\n")
    set_properties(config, {"auto.create.topics.enable": "false", "super.users": "User:A;User:B"})
    assert config.read_text().splitlines() == [
        "# auto.create.topics.enable=true",
        "auto.create.topics.enable=false",
        "x=1",
        "super.users=User:A;User:B",
    ]


def test_listener_sections_use_the_lower_case_listener_name() -> None:
    assert mtls_section("I0") == {"listener.name.i0.ssl.client.auth": "required"}
    section = sasl_section("I1", ("SCRAM-SHA-512",))
    assert section == {
        "listener.name.i1.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.i1.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
    }
    with pytest.raises(ValueError, match="SCRAM"):
        sasl_section("I2", ("PLAIN",))


def test_each_instance_listener_has_the_asked_protocol(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text(
        "listeners=PLAINTEXT://127.0.0.1:9092\nadvertised.listeners=PLAINTEXT://127.0.0.1:9092\n"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
    )
    proxy = TcpProxy("127.0.0.1", 9093).start()
    try:
        names = add_listeners(config, {"streams-1": 9093}, {"streams-1": proxy}, "SASL_SSL")
    finally:
        proxy.close()
    assert names == {"streams-1": "I0"}
    lines = config.read_text().splitlines()
    assert lines[0] == "listeners=PLAINTEXT://127.0.0.1:9092,I0://127.0.0.1:9093"
    assert (
        lines[1] == f"advertised.listeners=PLAINTEXT://127.0.0.1:9092,I0://127.0.0.1:{proxy.port}"
    )
    assert lines[2].endswith(",I0:SASL_SSL")


def test_the_acls_wanted_are_those_mailtap_acls_computes_once_per_principal() -> None:
    config = {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "schema_registry_url": "http://r"},
        "streams": scenario.streams_section("soak-streams"),
    }
    wanted = instance_bindings({"streams-1": config, "streams-2": config})
    expected = bindings(PRINCIPALS["streams"], component_acls(config_from_dict(config), "streams"))
    assert list(wanted) == ["mailtap-streams"]
    assert expected and sorted(map(str, wanted["mailtap-streams"])) == sorted(map(str, expected))


def test_no_mode_is_the_plain_stack_and_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    assert type(make_stack(tmp_path, ("streams-1",), None)) is Stack
    secured = make_stack(tmp_path, ("streams-1",), "mtls")
    assert isinstance(secured, SecuredStack) and secured.mode == "mtls"
    with pytest.raises(ValueError, match="scram, mtls"):
        make_stack(tmp_path, ("streams-1",), "oauth")
