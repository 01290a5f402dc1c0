"""A permission the broker does not grant is one sentence, before a component sends anything.

A component asks the broker, at start and before its first send or commit, which operations its
principal may perform on its own topics and groups (KIP-430: ``include_authorized_operations``
in DescribeTopics and DescribeGroups) and compares them with the ACLs it needs
(:mod:`connectors.core.kafka.acls`). The first one missing is a :class:`PermissionDenied`: a
:class:`ConfigError` whose sentence names the principal, the operation, the resource and the
``kafka-acls`` command that grants it::

    kafka: principal User:mailtap-smtp-sink may not WRITE topic mail.delivery
    (TOPIC_AUTHORIZATION_FAILED): grant it with: kafka-acls.sh --bootstrap-server BOOTSTRAP --add ...

Without the check, a refusal surfaced late and vaguely: librdkafka's "Authorization failed"
without a resource, or not at all (a sink without Read on ``mail.suppressions`` saw an empty
list and sent to suppressed recipients). Transactional ids cannot be asked about: a refused
``init_transactions`` is translated where the id is known (:func:`denied_transactional_id`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.acls import Acl
from connectors.core.kafka.clients import admin_client, cluster_metadata, raise_if_stopping
from connectors.core.kafka.errors import PermissionDenied

log = logging.getLogger(__name__)

#: A prefixed group ACL is checked on one name under the prefix (a throw-away group's).
PROBE_SUFFIX = "permission-check"
#: One DescribeTopics and one DescribeGroups: a second on a healthy cluster.
CHECK_TIMEOUT_S = 30.0

#: How long to wait before asking a group coordinator that was not ready again.
COORDINATOR_RETRY_S = 0.5
#: One DescribeGroups request; asked again on a timeout until the check's timeout.
GROUP_REQUEST_S = 10.0
_COORDINATOR_NOT_READY = frozenset(
    {"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS", "_TIMED_OUT"}
)

_ERRORS = {
    "topic": "TOPIC_AUTHORIZATION_FAILED",
    "group": "GROUP_AUTHORIZATION_FAILED",
    "transactional-id": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "cluster": "CLUSTER_AUTHORIZATION_FAILED",
}
_OPERATIONS = {
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Describe": AclOperation.DESCRIBE,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
    "Create": AclOperation.CREATE,
    "AlterConfigs": AclOperation.ALTER_CONFIGS,
    "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
}


def permission_denied(kafka: KafkaSettings, acl: Acl) -> PermissionDenied:
    """The error that says the broker does not let this principal perform ``acl``'s operation on
    its resource, with the command that grants it."""
    principal = principal_of(kafka)
    error = _ERRORS[acl.resource_type]
    resource = f"{acl.resource_type} {acl.name}"
    if acl.pattern == "prefixed":
        resource += "* (prefixed)"
    return PermissionDenied(
        f"kafka: principal User:{principal} may not {acl.operation.upper()} "
        f"{resource} ({error}): grant it with: {acl.kafka_acls_command(principal)}",
        principal=principal,
        acl=acl,
        error=error,
    )


def principal_of(kafka: KafkaSettings) -> str:
    """The user name the broker most likely authenticates this client as.

    SASL PLAIN/SCRAM: the user name. mTLS: the certificate's subject CN (the broker's default
    ``ssl.principal.mapping.rules`` give the whole DN; ``mailtap dev up --secure`` maps it to the
    CN). OAUTHBEARER: the client id (the token's ``sub`` at most identity providers).
    """
    if kafka.sasl_username:
        return kafka.sasl_username
    if kafka.sasl_oauthbearer is not None:
        return kafka.sasl_oauthbearer.client_id
    if kafka.ssl_certificate_location:
        try:
            from cryptography import x509
            from cryptography.x509.oid import NameOID

            with open(kafka.ssl_certificate_location, "rb") as pem:
                cert = x509.load_pem_x509_certificate(pem.read())
            names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            if names:
                return str(names[0].value)
        except (OSError, ValueError):
            pass  # security.py reports an unreadable certificate in its own words
    return "ANONYMOUS"


def check_permissions(
    kafka: KafkaSettings,
    needed: Iterable[Acl],
    timeout: float = CHECK_TIMEOUT_S,
    *,
    cluster_wait: float | None = None,
) -> list[str]:
    """Raise :class:`PermissionDenied` for the first ACL in ``needed`` the broker does not grant.

    Waits for the cluster first, as every start-up does (:func:`cluster_metadata`): an
    unreachable broker is the "cannot reach Kafka" sentence, a refused login or TLS handshake
    its own, never an error of the check.

    Literal topics that do not exist yet are left out and returned: the component creates them
    (:func:`connectors.core.kafka.topics.ensure_topic_specs` translates a refused Create), then
    checks them with :func:`check_created`. Prefixed topics and transactional ids cannot be
    asked about here (a refused ``init_transactions`` is translated where the id is known).
    ``cluster_wait``: how long to wait for the cluster (default ``timeout``).
    """
    needed = list(needed)
    topics = _by_name(a for a in needed if a.resource_type == "topic" and a.pattern == "literal")
    groups = _by_name(a for a in needed if a.resource_type == "group")
    admin = admin_client(kafka)
    cluster_metadata(admin, kafka, timeout if cluster_wait is None else cluster_wait)
    missing = _check_topics(kafka, admin, topics, timeout)
    if groups:
        probes = {_probe_name(acls[0]): acls for acls in groups.values()}
        for name, result in _group_descriptions(admin, list(probes), timeout).items():
            if isinstance(result, KafkaException):
                if result.args[0].name() == "GROUP_AUTHORIZATION_FAILED":
                    raise permission_denied(kafka, _first(probes[name], "Describe")) from None
                raise result
            _compare(kafka, probes[name], result.authorized_operations)
    log.info("kafka permissions checked: %d ACLs granted", len(needed) - len(missing))
    return missing


#: How long a topic created a moment ago may be missing from the broker's answers (its
#: metadata has not reached the broker asked yet).
NEW_TOPIC_WAIT_S = 30.0
NEW_TOPIC_POLL_S = 0.2


def check_created(
    kafka: KafkaSettings,
    needed: Iterable[Acl],
    topics: Iterable[str],
    timeout: float = NEW_TOPIC_WAIT_S,
) -> None:
    """The ACLs of ``needed`` on ``topics``, which :func:`check_permissions` found missing and
    the component has created since (or another component at the same moment). A topic created
    a moment ago is not in every answer at once: asked again until ``timeout``, then a topic
    still unknown is the sentence to create it."""
    pending = set(topics)
    if not pending:
        return
    needed = list(needed)
    admin = admin_client(kafka)
    deadline = time.monotonic() + timeout
    while True:
        by_name = _by_name(
            a
            for a in needed
            if a.resource_type == "topic" and a.pattern == "literal" and a.name in pending
        )
        pending = set(_check_topics(kafka, admin, by_name, timeout))
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ConfigError(
                f"topics {', '.join(sorted(pending))} do not exist {timeout:.0f}s after they "
                "were ensured; create them with `mailtap topics ensure -c CONFIG`"
            )
        raise_if_stopping()
        time.sleep(NEW_TOPIC_POLL_S)


def check_prefixed_topics(
    kafka: KafkaSettings,
    needed: Iterable[Acl],
    names: Iterable[str],
    timeout: float = CHECK_TIMEOUT_S,
) -> None:
    """The prefixed topic ACLs of ``needed``, checked on ``names``: topics under those prefixes
    that exist now (the streams worker's changelogs, once it has created them). A refusal names
    the prefixed ACL, the one to grant."""
    prefixed = [a for a in needed if a.resource_type == "topic" and a.pattern == "prefixed"]
    under = {name: [a for a in prefixed if name.startswith(a.name)] for name in names}
    _check_topics(kafka, admin_client(kafka), {k: v for k, v in under.items() if v}, timeout)


def under_prefix(
    kafka: KafkaSettings, refused: PermissionDenied, needed: Iterable[Acl]
) -> PermissionDenied:
    """``refused`` (an operation on a literal topic) as the prefixed ACL of ``needed`` that
    would grant it, when there is one: that is what the operator grants."""
    acl = refused.acl
    if not isinstance(acl, Acl) or acl.pattern != "literal":
        return refused
    for wanted in needed:
        if (
            wanted.pattern == "prefixed"
            and wanted.resource_type == acl.resource_type
            and wanted.operation == acl.operation
            and acl.name.startswith(wanted.name)
        ):
            return permission_denied(kafka, wanted)
    return refused


def _check_topics(
    kafka: KafkaSettings, admin: AdminClient, topics: dict[str, list[Acl]], timeout: float
) -> list[str]:
    """Compare the operations granted on ``topics``; returns those that do not exist."""
    if not topics:
        return []
    missing = []
    futures = admin.describe_topics(
        TopicCollection(list(topics)),
        include_authorized_operations=True,
        request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            granted = future.result().authorized_operations
        except KafkaException as exc:
            code = exc.args[0].name()
            if code == "UNKNOWN_TOPIC_OR_PART":
                missing.append(name)
                continue
            if code == "TOPIC_AUTHORIZATION_FAILED":
                raise permission_denied(kafka, _first(topics[name], "Describe")) from None
            raise
        _compare(kafka, topics[name], granted)
    return sorted(missing)


def _group_descriptions(admin: AdminClient, names: list[str], timeout: float) -> dict[str, Any]:
    """``{group: description or KafkaException}``; a group coordinator that is not ready yet
    (a fresh cluster creates ``__consumer_offsets`` on first use: NOT_COORDINATOR or a slow
    answer for a while) is asked again until ``timeout``, then the group is left out with a
    warning: its first use reports a refusal itself."""
    deadline = time.monotonic() + timeout
    found: dict[str, Any] = {}
    pending = list(names)
    while pending:
        futures = admin.describe_consumer_groups(
            pending, include_authorized_operations=True, request_timeout=GROUP_REQUEST_S
        )
        pending = []
        for name, future in futures.items():
            try:
                found[name] = future.result()
            except KafkaException as exc:
                if exc.args[0].name() not in _COORDINATOR_NOT_READY:
                    found[name] = exc
                elif time.monotonic() < deadline:
                    pending.append(name)
                else:
                    log.warning(
                        "kafka permissions: group %s not checked (%s)", name, exc.args[0].str()
                    )
        if pending:
            time.sleep(COORDINATOR_RETRY_S)
    return found


def denied(kafka: KafkaSettings, exc: KafkaException, acl: Acl) -> PermissionDenied | None:
    """``exc`` as a :class:`PermissionDenied` for ``acl`` when it is an authorization failure."""
    if exc.args and exc.args[0].name() == _ERRORS[acl.resource_type]:
        return permission_denied(kafka, acl)
    return None


def denied_transactional_id(
    kafka: KafkaSettings, exc: KafkaException, transactional_id: str, prefix: str | None = None
) -> PermissionDenied | None:
    """A refused ``init_transactions``: the ACL is on ``prefix`` (prefixed) when given."""
    if prefix:
        return denied(kafka, exc, Acl("transactional-id", prefix, "Write", "prefixed"))
    return denied(kafka, exc, Acl("transactional-id", transactional_id, "Write"))


def _by_name(acls: Iterable[Acl]) -> dict[str, list[Acl]]:
    found: dict[str, list[Acl]] = {}
    for acl in acls:
        found.setdefault(acl.name, []).append(acl)
    return found


def _probe_name(acl: Acl) -> str:
    return acl.name + PROBE_SUFFIX if acl.pattern == "prefixed" else acl.name


def _first(acls: Sequence[Acl], operation: str) -> Acl:
    """The needed ACL that grants ``operation``: itself, or Read/Write that imply Describe."""
    for wanted in (operation, "Read", "Write"):
        for acl in acls:
            if acl.operation == wanted:
                return acl
    return acls[0]


def _compare(
    kafka: KafkaSettings, acls: Sequence[Acl], authorized: list[AclOperation] | None
) -> None:
    # None: the broker did not say (older than KIP-430): the operations themselves will tell.
    # Without an authorizer the broker lists every operation. The implied ones (Read implies
    # Describe, ...) are listed too; ALL grants everything.
    if authorized is None or AclOperation.ALL in authorized:
        return
    granted = set(authorized)
    for acl in acls:
        if _OPERATIONS[acl.operation] not in granted:
            raise permission_denied(kafka, acl)
