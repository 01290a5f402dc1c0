"""``mailtap acls --grant``: create a component's ACLs on the cluster through the config's own
Kafka login (a principal allowed to alter the cluster's ACLs, e.g. the admin's).

The bindings are exactly those ``mailtap acls`` prints (:func:`mailtap.acls.component_acls`):
ALLOW for ``User:<principal>`` from any host, literal or prefixed as computed. Creating a
binding that exists already changes nothing (Kafka's CreateAcls is idempotent), so a grant may
be run again after a config change; bindings no longer needed are not removed (that is the
admin's decision, ``kafka-acls.sh --remove``).
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.acls import Acl
from connectors.core.kafka.clients import admin_client, cluster_metadata
from connectors.core.kafka.permissions import principal_of

#: How long the cluster may take to answer the login and the CreateAcls request; a cluster
#: that answers metadata answers this within seconds, the rest is a loaded controller.
TIMEOUT_S = 30.0

_KINDS = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.BROKER,
}
_OPERATIONS = {
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
    "AlterConfigs": AclOperation.ALTER_CONFIGS,
    "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
}


def bindings(principal: str, acls: Iterable[Acl]) -> list[AclBinding]:
    """``acls`` as confluent-kafka's ALLOW bindings of ``User:principal`` from any host."""
    return [
        AclBinding(
            _KINDS[acl.resource_type],
            acl.name if acl.resource_type != "cluster" else "kafka-cluster",
            ResourcePatternType.PREFIXED
            if acl.pattern == "prefixed"
            else ResourcePatternType.LITERAL,
            f"User:{principal}",
            "*",
            _OPERATIONS.get(acl.operation) or AclOperation[acl.operation.upper()],
            AclPermissionType.ALLOW,
        )
        for acl in acls
    ]


def grant(kafka: KafkaSettings, principal: str, acls: Iterable[Acl]) -> list[AclBinding]:
    """Create the bindings of ``acls`` for ``User:principal`` as the login of ``kafka``.

    Raises ConfigError (a sentence saying what to change) when the login is refused or may not
    create ACLs; :class:`~connectors.core.kafka.errors.KafkaUnavailable` when the cluster does
    not answer.
    """
    wanted = bindings(principal, acls)
    admin = admin_client(kafka)
    # The login first: a wrong password is reported as such, not as a failed CreateAcls.
    cluster_metadata(admin, kafka, TIMEOUT_S)
    for binding, future in admin.create_acls(wanted, request_timeout=TIMEOUT_S).items():
        try:
            future.result(TIMEOUT_S)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                raise ConfigError(
                    f"kafka: principal User:{principal_of(kafka)} may not create ACLs "
                    f"(ALTER on the cluster, {err.name()}): run `mailtap acls` with an admin's "
                    f"login, or without --grant and give the kafka-acls.sh lines to your Kafka admin"
                ) from None
            raise ConfigError(
                f"kafka: creating the ACL {binding} failed: {err.str()} ({err.name()})"
            ) from None
    return wanted
