"""Wiring shared by the IMAP and EWS sources: which mailboxes this instance runs, kept current.

    sharing = start_sharing(kafka, settings.group, "imap", {"support": ("INBOX",)},
                            by_account, source.apply, metrics)
    ...
    sharing.close()     # stops every owned mailbox, then leaves the group

The wanted mailboxes are the configuration's, changed by the mailboxes topic
(:mod:`connectors.core.source.ownership.catalog`); with a group, this instance runs its share of them
(:mod:`connectors.core.source.ownership.group`), else all of them. ``apply(owned)`` is the source's: start
what is new in ``owned``, stop and join the rest before returning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from connectors.core.config import KafkaSettings
from connectors.core.metrics import SourceMetrics
from connectors.core.source.ownership.catalog import MailboxCatalog, MailboxWatcher, topic_spec
from connectors.core.source.ownership.group import (
    Assignment,
    GroupMembership,
    GroupSettings,
    Placement,
    WorkUnit,
    create_if_missing,
)

log = logging.getLogger(__name__)


@dataclass
class Sharing:
    assignment: Assignment
    watcher: MailboxWatcher
    membership: GroupMembership | None
    catalog: MailboxCatalog

    def reconfigure(
        self, configured: Mapping[str, Sequence[str]], settings_changed: Callable[[], None]
    ) -> None:
        """A configuration reload (:mod:`connectors.core.source.reload`): the ``configured`` accounts
        and folders from now on; ``settings_changed()`` swaps the source's account settings.
        What this instance owns of them starts, stops or restarts before this returns."""

        def change() -> None:
            self.catalog.reconfigure(configured)
            settings_changed()

        self.assignment.reconfigure(change)

    def close(self) -> None:
        # Stop the mailboxes first, then leave: the next owners start them only once they
        # stopped here (a graceful hand-over, no fencing needed). The threads' poll loops are
        # told to end first so that their last poll overlaps the workers' stop.
        self.watcher.request_stop()
        self.assignment.close()
        if self.membership is not None:
            self.membership.stop()
        self.watcher.close()


@dataclass
class MailboxesRead:
    """The mailboxes topic read to its end, the watcher that follows it once started."""

    catalog: MailboxCatalog
    watcher: MailboxWatcher
    #: The Assignment the watcher's callbacks reach, once start_sharing made it.
    assignment_box: list[Assignment]


def read_mailboxes(
    kafka: KafkaSettings, source: str, configured: Mapping[str, Sequence[str]]
) -> MailboxesRead:
    """Create the mailboxes topic if missing and read it to its end: network waits only, so a
    source may run this while it checks its other topics and loads its indexes (start-up pays
    the longer of them, not their sum), then hand the result to :func:`start_sharing`."""
    create_if_missing(kafka, topic_spec(kafka))
    catalog = MailboxCatalog(source, configured)
    assignment_box: list[Assignment] = []
    watcher = MailboxWatcher(
        kafka,
        catalog.record,
        on_change=lambda: assignment_box[0].refresh(),
        on_idle=lambda: assignment_box[0].retry(),  # a failed start is tried again
    )
    try:
        watcher.read_to_end()
    except BaseException:
        watcher.close()
        raise
    return MailboxesRead(catalog, watcher, assignment_box)


def start_sharing(
    kafka: KafkaSettings,
    group: GroupSettings | None,
    source: str,
    configured: Mapping[str, Sequence[str]],
    placement: Placement,
    apply: Callable[[frozenset[WorkUnit]], None],
    metrics: SourceMetrics,
    mailboxes: MailboxesRead | None = None,
) -> Sharing:
    """Read the mailboxes topic (unless ``mailboxes`` is it, read already), then join the
    group (or own everything) and start the owned mailboxes; follow both from then on. Without
    a group the owned mailboxes have started when this returns; with one, they start on the
    first assignment (on the group's thread)."""
    if mailboxes is None:
        mailboxes = read_mailboxes(kafka, source, configured)
    catalog, watcher, assignment_box = (
        mailboxes.catalog,
        mailboxes.watcher,
        mailboxes.assignment_box,
    )
    membership: GroupMembership | None = None
    if group is not None:

        def partitions_changed(partitions: frozenset[int]) -> None:
            assert membership is not None
            metrics.assignment = {
                "group": group.id,
                "member": membership.client_id,
                "work_topic": membership.topic,
                "partitions": sorted(partitions),
            }
            assignment_box[0].partitions_changed(partitions)

        membership = GroupMembership(kafka, group, source, partitions_changed)
    assignment = Assignment(catalog.wanted, placement, apply, membership)
    assignment_box.append(assignment)
    if membership is not None:
        metrics.assignment = {
            "group": group.id if group else "",
            "member": membership.client_id,
            "work_topic": membership.topic,
            "partitions": [],
        }
        membership.start()
    else:
        assignment.refresh()
    watcher.start()
    return Sharing(assignment, watcher, membership, catalog)
