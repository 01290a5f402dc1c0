"""The secured broker of `mailtap dev up --secure` (`mailtap.dev.secure`), started once per
session and shared by the tests of this folder, which keep apart by unique topic and group names.

- ``secure_kafka``: a `mailtap.dev.secure.SecureKafka` (listeners, CA, principals, OAuth server);
  its processes end with the session, even when pytest is killed (die-with-parent).
- ``kafka_settings(component, mechanism)``: the `KafkaSettings` a component uses to reach it.
- ``grant(admin, bindings(principal, acls))``: ACLs created through the admin (super user)
  listener (``bindings`` is `mailtap.dev.secure_acls`'s, what ``dev up --secure`` grants).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from connectors.core.config import KafkaSettings
from mailtap.dev import process, secure
from mailtap.dev.process import group_members
from mailtap.dev.secure_acls import bindings, principal_bindings

__all__ = ["allow", "bindings", "create_topic", "grant", "revoke"]


@pytest.fixture(scope="session")
def secure_kafka() -> Iterator[secure.SecureKafka]:
    process.tie_services_to_this_process()
    folder = Path(tempfile.mkdtemp(prefix="mailtap-secure-"))
    info, pids = secure.start_standalone(folder)
    try:
        yield info
    finally:
        for pid in pids:
            process.stop_group(pid)
        leftovers = {pid: group_members(pid) for pid in pids if group_members(pid)}
        shutil.rmtree(folder, ignore_errors=True)
        if leftovers:
            raise RuntimeError(f"the secured broker left processes running: {leftovers}")


KafkaSettingsFor = Callable[..., KafkaSettings]


@pytest.fixture(scope="session")
def kafka_settings(secure_kafka: secure.SecureKafka) -> KafkaSettingsFor:
    def settings(component: str, mechanism: str, **overrides: Any) -> KafkaSettings:
        section = secure_kafka.kafka_section(component, mechanism)
        return KafkaSettings.model_validate({**section, **overrides})

    return settings


@pytest.fixture(scope="session")
def admin(secure_kafka: secure.SecureKafka) -> AdminClient:
    """An admin client on the PLAINTEXT listener: User:ANONYMOUS, a super user."""
    # Its log lines through Python logging: librdkafka would print them to stderr itself.
    logger = logging.getLogger("tests.secure.admin")
    return AdminClient({"bootstrap.servers": secure_kafka.admin_bootstrap, "logger": logger})


def create_topic(admin: AdminClient, name: str, partitions: int = 1) -> None:
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)


def allow(
    principal: str, resource: ResourceType, name: str, *operations: AclOperation
) -> list[AclBinding]:
    return [
        AclBinding(
            resource,
            name,
            ResourcePatternType.LITERAL,
            f"User:{principal}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in operations
    ]


def revoke(admin: AdminClient, acls: list[AclBinding]) -> None:
    filters = [
        AclBindingFilter(
            b.restype,
            b.name,
            b.resource_pattern_type,
            b.principal,
            b.host,
            b.operation,
            b.permission_type,
        )
        for b in acls
    ]
    for future in admin.delete_acls(filters).values():
        future.result(30)


#: How long a grant may take to be served after CreateAcls answered, and how often to look.
GRANT_APPLIED_S = 30.0
GRANT_POLL_S = 0.1


def grant(admin: AdminClient, acls: list[AclBinding]) -> None:
    """Create ``acls`` and return once the broker serves them. CreateAcls answers when the
    controller has committed the records; the broker's authorizer has them only once it has
    applied them from the metadata log, and a component started in between was refused an
    ACL it had been granted (test_secure_permissions on a loaded machine: "may not WRITE
    topic mail.commands.dlq...", not the one ACL left out)."""
    for future in admin.create_acls(acls).values():
        future.result(30)
    deadline = time.monotonic() + GRANT_APPLIED_S
    for principal in sorted({b.principal.removeprefix("User:") for b in acls}):
        wanted = {b for b in acls if b.principal == f"User:{principal}"}
        while not wanted <= set(principal_bindings(admin, principal)):
            assert time.monotonic() < deadline, f"User:{principal}'s new ACLs not served"
            time.sleep(GRANT_POLL_S)
