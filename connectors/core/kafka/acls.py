"""The Kafka ACLs each mailtap component needs for one configuration, and nothing more.

One source of truth for ``mailtap acls`` (:mod:`mailtap.acls` reads the components' sections), the ACL table of deploy/README.md and the error line a
component logs when the broker refuses it an operation (:mod:`connectors.core.kafka.denials`).
Pure: no broker is asked; the names come from the configuration (``kafka.topics``, the
sections' group ids, retry tiers, bounce accounts, suppression list, streams app id).

A component's own topics get ``Describe``, ``DescribeConfigs`` and ``Create``: it ensures them
before it starts (created when missing, cleanup policy checked) and says so when it may not. The
topics it writes that carry mailtap's Avro records also get ``Read``: before a writer starts it
reads the newest records to refuse a topic holding the other encoding
(:mod:`connectors.core.kafka.encoding`), its own output only. The other teams' topics and the
checks across all topics are the admin's (``mailtap topics ensure``).

Learned from the broker's authorizer log (``kafka.authorizer.logger``, PITFALLS.md) with Kafka
4.1: a consumer that only ``assign()``s and never commits needs ``Describe`` on its group (the
offset fetch), not ``Read``; a transactional producer needs ``Write`` on its transactional id
and on the topics, no cluster ``IdempotentWrite`` (KIP-679). ``Describe`` is left out where
``Read`` or ``Write`` on the same resource implies it (and ``DescribeConfigs`` where
``AlterConfigs`` does): the authorizer grants it with them.

Example::

    >>> from connectors.core.config import KafkaSettings
    >>> kafka = KafkaSettings(bootstrap_servers="k:9092")
    >>> [str(a) for a in reader_acls(kafka, group_prefix="team-")]
    ['Read group team- (prefixed)', 'Read topic mail.events']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from connectors.core.config import KafkaSettings

ResourceType = Literal["topic", "group", "transactional-id", "cluster"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal[
    "Read",
    "Write",
    "Describe",
    "DescribeConfigs",
    "Create",
    "AlterConfigs",
    "IdempotentWrite",
]

COMPONENTS = (
    "imap-source",
    "ews-source",
    "graph-source",
    "streams",
    "smtp-sink",
    "console",
    "admin",
    "reader",
)

#: Fixed names in the components' code; a unit test checks they match (tests/unit/core/kafka).
IMAP_TRANSACTIONAL_PREFIX = "mailtap-imap-"  # connectors.imap.source.TRANSACTIONAL_PREFIX + "-"
EWS_TRANSACTIONAL_PREFIX = "mailtap-ews-"  # connectors.ews.source.TRANSACTIONAL_ID_PREFIX + "-"
GRAPH_TRANSACTIONAL_PREFIX = (
    "mailtap-graph-"  # connectors.graph.source.TRANSACTIONAL_ID_PREFIX + "-"
)
IMAP_INDEX_GROUP = "mailtap-imap-index"  # connectors.imap.index / indexlog
OFFSETS_GROUP = "mailtap-offsets-reader"  # connectors.core.kafka.offsets
MAILBOXES_GROUP = "mailtap-mailboxes-reader"  # connectors.core.source.ownership.catalog
ENCODING_CHECK_GROUP_PREFIX = "mailtap-encoding-check-"  # connectors.core.kafka.encoding
SUPPRESSIONS_GROUP_PREFIX = "mailtap-suppressions-"  # connectors.smtp.suppression
#: ``mailtap consume`` names its group so; the default group prefix of a reader.
CONSUME_GROUP_PREFIX = "mailtap-consume-"
#: The console's (and ``mailtap status|dlq|trace``'s) throw-away readers: they ``assign()``
#: and never commit (mailtap.commands.topicscan, mailtap.trace).
SCAN_GROUP_PREFIX = "mailtap-scan-"
LAG_GROUP_PREFIX = "mailtap-lag-"
TRACE_GROUP_PREFIX = "mailtap-trace-"
#: ``mailtap dlq drop`` and the console mark a handled DLQ record on ``<dlq>.dropped``.
DROPPED_SUFFIX = ".dropped"


#: operation -> the operations that imply it (granted with them by Kafka's authorizer).
_IMPLIED: dict[str, set[str]] = {
    "Describe": {"Read", "Write", "Delete", "Alter"},
    "DescribeConfigs": {"AlterConfigs"},
}


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW binding: ``operation`` on ``resource_type`` ``name`` (literal or prefixed)."""

    resource_type: ResourceType
    name: str
    operation: Operation
    pattern: Pattern = "literal"
    #: Why the component needs it (shown by ``mailtap acls --format json``).
    reason: str = field(default="", compare=False)

    def __str__(self) -> str:
        suffix = " (prefixed)" if self.pattern == "prefixed" else ""
        return f"{self.operation} {self.resource_type} {self.name}{suffix}"

    def kafka_acls_args(self, principal: str) -> list[str]:
        """The arguments of Kafka's ``kafka-acls.sh --add`` that grant this binding."""
        args = ["--add", "--allow-principal", f"User:{principal}", "--operation", self.operation]
        if self.pattern == "prefixed":
            args += ["--resource-pattern-type", "prefixed"]
        option = {
            "topic": "--topic",
            "group": "--group",
            "transactional-id": "--transactional-id",
        }.get(self.resource_type)
        return [*args, option, self.name] if option else [*args, "--cluster"]

    def kafka_acls_command(self, principal: str, bootstrap: str = "BOOTSTRAP") -> str:
        return " ".join(
            ["kafka-acls.sh", "--bootstrap-server", bootstrap, *self.kafka_acls_args(principal)]
        )

    def as_json(self) -> dict[str, str]:
        return {
            "resource_type": self.resource_type,
            "name": self.name,
            "pattern": self.pattern,
            "operation": self.operation,
            "reason": self.reason,
        }


class _Acls:
    """Collects bindings once each (the first reason wins), in a stable order."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._acls: dict[Acl, Acl] = {}
        #: Names mailtap makes up are inside ``kafka.namespace`` (``prod.mailtap-imap-index``).
        self.qualify = kafka.qualify

    def topic(self, name: str, *ops: Operation, reason: str, prefixed: bool = False) -> None:
        self._add("topic", name, ops, reason, prefixed)

    def group(self, name: str, *ops: Operation, reason: str, prefixed: bool = False) -> None:
        self._add("group", name, ops, reason, prefixed)

    def transactional_ids(self, prefix: str, reason: str) -> None:
        self._add("transactional-id", prefix, ("Write", "Describe"), reason, True)

    def own_topics(self, names: Iterable[str], reason: str) -> None:
        """Topics the component ensures itself before it starts."""
        for name in names:
            self.topic(name, "Describe", "DescribeConfigs", "Create", reason=reason)

    def encoding_checked(self, names: Iterable[str]) -> None:
        for name in names:
            self.topic(name, "Read", reason="encoding check of a topic it writes")
        self.group(
            self.qualify(ENCODING_CHECK_GROUP_PREFIX),
            "Describe",
            reason="encoding check reads with a throw-away group",
            prefixed=True,
        )

    def _add(
        self, kind: ResourceType, name: str, ops: Iterable[Operation], reason: str, prefixed: bool
    ) -> None:
        for op in ops:
            acl = Acl(kind, name, op, "prefixed" if prefixed else "literal", reason)
            self._acls.setdefault(acl, acl)

    def sorted(self) -> list[Acl]:
        """The bindings without those another one implies (Kafka's authorizer: Read, Write,
        Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs)."""
        ops: dict[tuple[str, str, str], set[str]] = {}
        for acl in self._acls.values():
            ops.setdefault((acl.resource_type, acl.name, acl.pattern), set()).add(acl.operation)
        return sorted(
            acl
            for acl in self._acls.values()
            if not _IMPLIED.get(acl.operation, set())
            & ops[(acl.resource_type, acl.name, acl.pattern)]
        )


def markdown_row(principal: str, acls: Iterable[Acl]) -> str:
    """One row of deploy/README.md's ACL table: ``| principal | topics | groups | transactional ids |``."""
    cells: dict[ResourceType, dict[tuple[str, Pattern], list[str]]] = {}
    for acl in acls:
        ops = cells.setdefault(acl.resource_type, {}).setdefault((acl.name, acl.pattern), [])
        ops.append(acl.operation)

    def cell(kind: ResourceType) -> str:
        parts = [
            f"{'prefix ' if pattern == 'prefixed' else ''}`{name}` ({', '.join(sorted(ops))})"
            for (name, pattern), ops in sorted(cells.get(kind, {}).items())
        ]
        return "; ".join(parts) or "—"

    return f"| `{principal}` | {cell('topic')} | {cell('group')} | {cell('transactional-id')} |"


def retry_topics(kafka: KafkaSettings, tiers: Iterable[str]) -> list[str]:
    return [f"{kafka.topics.retry_prefix}.{tier}" for tier in tiers]


def source_acls(
    kafka: KafkaSettings,
    *,
    source: Literal["imap", "ews", "graph"],
    group: Any = None,
) -> list[Acl]:
    """The IMAP, EWS or Graph source: ``group`` is its ``GroupSettings`` (None: no group)."""
    t = kafka.topics
    acls = _Acls(kafka)
    own = [t.events, t.offsets, t.mailboxes]
    if source == "imap":
        own.append(t.imap_index)
    acls.own_topics(own, reason="ensured at start")
    acls.topic(t.events, "Write", reason="the mail events, in its transactions")
    acls.topic(
        t.offsets, "Read", "Write", reason="its cursors: read at start, written in its transactions"
    )
    acls.group(
        acls.qualify(OFFSETS_GROUP),
        "Describe",
        reason="reads the offsets topic (assigned, no commits)",
    )
    acls.topic(t.mailboxes, "Read", reason="the mailboxes added with mailtap mailboxes add")
    acls.group(
        acls.qualify(MAILBOXES_GROUP), "Describe", reason="reads the mailboxes topic (assigned)"
    )
    if source == "imap":
        acls.topic(
            t.imap_index, "Read", "Write", reason="its Message-ID index, in its transactions"
        )
        acls.group(
            acls.qualify(IMAP_INDEX_GROUP), "Describe", reason="reads the index topic (assigned)"
        )
    # A mail that cannot be parsed goes to the DLQ in the folder's transaction
    # (connectors/core/source/records.py), for every source: without Write there, one broken
    # mail fails every transaction of its folder on a secured cluster.
    acls.topic(t.dlq, "Write", reason="unparseable mail, in its transactions")
    acls.encoding_checked([t.events])
    prefix = acls.qualify(
        {
            "imap": IMAP_TRANSACTIONAL_PREFIX,
            "ews": EWS_TRANSACTIONAL_PREFIX,
            "graph": GRAPH_TRANSACTIONAL_PREFIX,
        }[source]
    )
    acls.transactional_ids(prefix, reason="one transactional id per mailbox folder")
    if group is not None:
        work = group.topic(source)
        acls.own_topics([work], reason="the group's work topic, ensured at start")
        acls.topic(work, "Read", reason="the group divides the work topic's partitions")
        acls.group(group.id, "Read", "Describe", reason="the instances' consumer group")
    return acls.sorted()


def sink_acls(kafka: KafkaSettings, settings: Any) -> list[Acl]:
    """The SMTP sink, ``settings`` its ``SmtpSinkSettings`` (with bounce reader when it has
    bounce accounts)."""
    t = kafka.topics
    retries = retry_topics(kafka, settings.retry_tiers)
    acls = _Acls(kafka)
    own = [t.commands, *retries, t.dlq, t.delivery, settings.state_topic]
    if settings.suppression.enabled:
        own.append(t.suppressions)
    acls.own_topics(own, reason="ensured at start")
    acls.topic(t.commands, "Read", reason="the reply commands")
    for name in retries:
        acls.topic(name, "Read", "Write", reason="a deferred command waits here for its retry")
    acls.topic(t.dlq, "Write", reason="commands that can never be sent")
    acls.topic(t.delivery, "Write", reason="the delivery events")
    acls.topic(settings.state_topic, "Read", "Write", reason="intent/outcome of each command")
    acls.group(settings.group_id, "Read", "Describe", reason="the sink's consumer group")
    acls.group(
        f"{settings.state_topic}.reader", "Describe", reason="reads the state topic at start"
    )
    acls.transactional_ids(f"{settings.group_id}.", reason="one transactional id per instance")
    if settings.suppression.enabled:
        acls.topic(t.suppressions, "Read", reason="no mail to a suppressed address")
        acls.group(
            acls.qualify(SUPPRESSIONS_GROUP_PREFIX),
            "Describe",
            reason="reads the suppression list (assigned)",
            prefixed=True,
        )
    acls.encoding_checked([t.commands, *retries, t.delivery])
    if settings.bounce_accounts:
        acls.topic(
            t.events, "Describe", "Read", reason="the bounce reader reads the bounce accounts' mail"
        )
        acls.group(settings.bounce_group_id, "Read", "Describe", reason="the bounce reader's group")
        acls.transactional_ids(
            f"{settings.bounce_group_id}.", reason="the bounce reader's transactions"
        )
        if settings.suppression.enabled:
            acls.topic(t.suppressions, "Write", reason="the bounce reader suppresses hard bounces")
    return acls.sorted()


def streams_acls(kafka: KafkaSettings, app_id: str) -> list[Acl]:
    """The streams worker: faust names its group and internal topics after ``app_id``."""
    t = kafka.topics
    acls = _Acls(kafka)
    acls.own_topics([t.events, t.commands, t.workflow], reason="ensured at start")
    acls.topic(t.events, "Describe", "Read", reason="the mail events it routes")
    acls.topic(t.commands, "Describe", "Write", reason="the reply commands")
    acls.topic(t.workflow, "Describe", "Write", reason="the workflow events")
    acls.encoding_checked([t.commands, t.workflow])
    acls.topic(
        f"{app_id}-",
        "Create",
        "Describe",
        "DescribeConfigs",
        "Read",
        "Write",
        reason="faust's changelogs, leader topic and the re-keyed mail",
        prefixed=True,
    )
    acls.group(app_id, "Read", "Describe", reason="faust's consumer group (streams.app_id)")
    return acls.sorted()


def admin_acls(
    kafka: KafkaSettings, topics: Iterable[str], avro_topics: Iterable[str]
) -> list[Acl]:
    """``mailtap topics ensure``: creates and aligns every topic, checks the Avro ones' encoding."""
    acls = _Acls(kafka)
    for name in topics:
        acls.topic(
            name,
            "Describe",
            "DescribeConfigs",
            "Create",
            "AlterConfigs",
            reason="created, cleanup policy aligned",
        )
    for name in avro_topics:
        acls.topic(name, "Read", reason="encoding check: one encoding per topic")
    acls.group(
        acls.qualify(ENCODING_CHECK_GROUP_PREFIX),
        "Describe",
        reason="encoding check reads with a throw-away group",
        prefixed=True,
    )
    return acls.sorted()


def reader_acls(kafka: KafkaSettings, *, group_prefix: str | None = None) -> list[Acl]:
    """Another team reading ``mail.events`` with its own consumer groups."""
    acls = _Acls(kafka)
    acls.topic(kafka.topics.events, "Describe", "Read", reason="the mail events")
    # mailtap consume's groups by default (inside the namespace, as consume names them).
    prefix = group_prefix if group_prefix is not None else acls.qualify(CONSUME_GROUP_PREFIX)
    acls.group(prefix, "Read", reason="its consumer groups", prefixed=True)
    return acls.sorted()


def console_acls(
    kafka: KafkaSettings,
    *,
    lag_groups: dict[str, list[str]],
    source_groups: Iterable[tuple[str, str]],
    state_topic: str,
) -> list[Acl]:
    """The web console (``mailtap run console``): it reads what ``mailtap status``, ``dlq`` and
    ``trace`` read and acts as ``mailtap dlq replay|drop``, ``mailboxes`` and ``suppressions``
    do, auditing each action. ``lag_groups`` are the consumer groups it reports the lag of with
    the topics each reads (``mailtap.commands.status.lag_groups``), ``source_groups`` the
    sources' ``(group id, work topic)`` whose members it names, ``state_topic`` the sink's
    (a replay with ``reset_state`` forgets a command's state there)."""
    t = kafka.topics
    dropped = f"{t.dlq}{DROPPED_SUFFIX}"
    acls = _Acls(kafka)
    acls.own_topics([t.audit], reason="the audit trail, ensured at start")
    acls.topic(t.audit, "Write", reason="one record per action: who, what, when, outcome")
    # The page and the list endpoints (status, DLQ, workflows) and the trace search.
    acls.topic(t.events, "Read", reason="mail per mailbox in the window; trace")
    acls.topic(t.offsets, "Read", reason="each mailbox's cursor")
    acls.topic(t.delivery, "Read", reason="delivery outcomes; a replay skips SENT commands")
    acls.topic(t.workflow, "Read", reason="workflow runs; trace")
    acls.topic(t.commands, "Read", reason="trace")
    acls.topic(t.dlq, "Read", reason="the dead letters it lists")
    acls.topic(dropped, "Read", reason="which dead letters were handled")
    # Its actions.
    acls.topic(t.commands, "Write", reason="DLQ replay: the original command again")
    acls.topic(state_topic, "Write", reason="DLQ replay with reset_state: the state tombstone")
    acls.topic(dropped, "Create", "Write", reason="DLQ drop and replay: the handled note")
    acls.own_topics([t.mailboxes, t.suppressions], reason="ensured before a change is written")
    acls.topic(t.mailboxes, "Read", "Write", reason="mailbox add, remove, pause, resume")
    acls.group(
        acls.qualify(MAILBOXES_GROUP), "Describe", reason="reads the mailboxes topic (assigned)"
    )
    acls.topic(t.offsets, "Write", reason="mailbox rewind: the cursor's tombstone")
    acls.topic(t.suppressions, "Read", "Write", reason="suppression list, add, remove")
    for prefix in (SCAN_GROUP_PREFIX, TRACE_GROUP_PREFIX, LAG_GROUP_PREFIX):
        acls.group(
            acls.qualify(prefix),
            "Describe",
            reason="reads with a throw-away group (assigned, no commits)",
            prefixed=True,
        )
    for group, topics in lag_groups.items():
        acls.group(group, "Describe", reason="the lag it reports (committed offsets)")
        for name in topics:
            acls.topic(name, "Describe", reason=f"the lag of {group} (end offsets)")
    for group, work_topic in source_groups:
        acls.group(group, "Describe", reason="which instance owns each mailbox")
        acls.topic(work_topic, "Describe", reason=f"the partitions {group} divides")
    return acls.sorted()
