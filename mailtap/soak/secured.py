"""``mailtap soak --secure scram|mtls``: the soak's stack on a broker secured the way a company
runs one, and the components given only the ACLs the docs list.

Each instance's own listener (see `mailtap.soak.stack`) is SASL_SSL with SCRAM-SHA-512
(``scram``) or SSL requiring a client certificate from the dev CA (``mtls``); the broker runs
``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false`` and no auto-created
topics, as ``mailtap dev up --secure`` does (`mailtap.dev.secure`). The harness, the verifier
and topic creation keep the PLAINTEXT listener, whose principal ``User:ANONYMOUS`` is a super
user. Every instance logs in as its component's principal (``User:mailtap-imap-source``, ...).

After the topics exist, each principal is granted exactly what ``mailtap acls`` computes for
its instances' configs, and the broker is read back to hold exactly that. SCRAM users and ACLs
live in the KRaft metadata, so a broker kill and restart keeps both. At the end, every
operation the authorizer refused one of these principals (`KafkaLayout.authorizer_log`) is a
violation: with the documented ACLs nothing should be refused.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from confluent_kafka.admin import AclBinding, AdminClient  # type: ignore[attr-defined]

from connectors.core.config import config_from_dict
from mailtap.acls import component_acls
from mailtap.dev import kafka
from mailtap.dev.secure import (
    PRINCIPALS,
    BrokerMaterial,
    authorizer_section,
    broker_material,
    client_section,
    mtls_section,
    sasl_section,
    scram_format_args,
    scram_marker,
    tls_section,
    write_log4j,
)
from mailtap.dev.secure_acls import bindings, hold_exactly
from mailtap.soak.fleet import component_of
from mailtap.soak.stack import HOST, Stack, add_listeners

log = logging.getLogger(__name__)

SecureMode = Literal["scram", "mtls"]
MODES: tuple[str, ...] = get_args(SecureMode)
#: The client mechanism (`mailtap.dev.secure.client_section`) of each mode.
MECHANISM: dict[str, str] = {"scram": "scram-sha-512", "mtls": "mtls"}
_PROTOCOL = {"scram": "SASL_SSL", "mtls": "SSL"}
#: A refusal as StandardAuthorizer logs it (kafka.authorizer.logger, INFO), e.g.
#: ``Principal = User:mailtap-streams is Denied operation = READ from host = 127.0.0.1 on
#: resource = Group:LITERAL:soak-streams for request = JoinGroup with resourceRefCount = 1 ...``
_DENIED = re.compile(r"Principal = User:(?P<principal>\S+) is Denied operation = (?P<rest>.*)")


@dataclass
class SecuredStack(Stack):
    """The soak's services with a secured broker (see the module's docstring)."""

    mode: SecureMode = "scram"
    material: BrokerMaterial | None = field(default=None, init=False)

    def _configure_kafka(self, listeners: dict[str, int]) -> None:
        material = self.material = broker_material(self.root / "secure", HOST)
        config = self.kafka_layout.config
        names = add_listeners(config, listeners, self.kafka_proxies, _PROTOCOL[self.mode])
        properties = {**authorizer_section(), **tls_section(material)}
        for name in names.values():
            properties.update(sasl_section(name) if self.mode == "scram" else mtls_section(name))
        kafka.set_properties(config, properties)
        write_log4j(self.kafka_layout)
        scram = scram_format_args(material.principals) if self.mode == "scram" else []
        kafka.prepare_storage(
            self.kafka_layout,
            self.broker_port,
            self.controller_port,
            extra_format_args=scram,
            marker=scram_marker(scram) if scram else "",
        )

    def kafka_client(self, instance: str) -> dict[str, Any]:
        assert self.material is not None, "start() first"
        who = self.material.principals[component_of(instance)]
        return client_section(
            who,
            MECHANISM[self.mode],
            self.kafka_address(instance),
            str(self.material.ca.certificate),
        )

    def grant_acls(self, configs: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
        wanted = instance_bindings(configs)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": log})  # type: ignore[dict-item]
        held = hold_exactly(admin, wanted)
        return {principal: [str(b) for b in acls] for principal, acls in held.items()}

    def denied(self) -> dict[str, list[str]]:
        path = self.kafka_layout.authorizer_log
        text = path.read_text(errors="replace") if path.exists() else ""
        return denied_operations(text, set(PRINCIPALS.values()))


def instance_bindings(configs: dict[str, dict[str, Any]]) -> dict[str, list[AclBinding]]:
    """``{principal: bindings}``: per principal, the union of what ``mailtap acls`` computes
    for each of its instances' configs (``{instance: config}``; the instances of one
    component share their names, so the union is each one's set)."""
    wanted: dict[str, set[AclBinding]] = {}
    for instance, config in configs.items():
        component = component_of(instance)
        principal = PRINCIPALS[component]
        acls = component_acls(config_from_dict(config), component)
        wanted.setdefault(principal, set()).update(bindings(principal, acls))
    return {principal: sorted(found, key=str) for principal, found in wanted.items()}


def denied_operations(authorizer_log: str, principals: set[str]) -> dict[str, list[str]]:
    """The refusals of ``principals`` in an authorizer log: ``{principal: [what, ...]}``,
    each entry the log's ``operation = ... on resource = ... for request = ...`` text."""
    found: dict[str, list[str]] = {}
    for line in authorizer_log.splitlines():
        match = _DENIED.search(line)
        if match and match["principal"] in principals:
            found.setdefault(match["principal"], []).append(match["rest"].strip())
    return found


def make_stack(root: Path, instances: tuple[str, ...], mode: str | None) -> Stack:
    """The plain soak stack, or the secured one for ``mode`` (one of `MODES`)."""
    if mode is None:
        return Stack(root, instances)
    if mode not in MODES:
        raise ValueError(f"unknown secure mode {mode!r}: one of {', '.join(MODES)}")
    return SecuredStack(root, instances, mode=mode)  # type: ignore[arg-type]
