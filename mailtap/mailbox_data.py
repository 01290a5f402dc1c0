"""What mailtap keeps of one mailbox, and how an operator forgets it: its cursor on the offsets
topic (``mailtap mailboxes rewind``), and with it its mails' keys on ``mail.events`` and their
claim-check blobs (``mailtap mailboxes purge``).

Both act only on a mailbox the sources no longer run (``mailtap mailboxes remove`` first): a
running source holds the cursor in memory and would write it again with its next batch.

The purge plan is pure (:func:`plan_purge`, records of ``mail.events`` in, keys and blob URIs
out) so that what it would delete can be shown before anything is deleted (``--dry-run``):

- the keys whose newest event is of this mailbox (account and folder; a mail that moved to
  another watched folder of the account is that folder's and stays);
- the blobs every event of those keys referred to (raw mail, attachments), minus every blob a
  key that stays still refers to: claim-check blobs are content-addressed, so the same
  attachment in two mailboxes is one blob; a pack file goes only when none of its blobs is
  referred to by a key that stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from confluent_kafka import Producer

from connectors.core.config import ClaimCheckSettings, KafkaSettings
from connectors.core.errors import ConfigError
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.offsets import canonical_json
from connectors.core.source.ownership.catalog import REMOVED, read_changes
from connectors.core.source.ownership.group import WorkUnit
from mailtap.trace import TopicRecord

#: The source kind as MailEvent.source.kind spells it, per mailtap's source name.
SOURCE_KINDS = {"imap": "IMAP", "ews": "EWS", "graph": "GRAPH"}
FLUSH_TIMEOUT_S = 60.0


def cursor_key(unit: WorkUnit) -> bytes:
    """The mailbox's key on the offsets topic (both sources use this partition layout)."""
    return canonical_json({"source": unit.source, "account": unit.account, "folder": unit.folder})


def require_stopped(kafka: KafkaSettings, unit: WorkUnit) -> None:
    """Raise unless the mailboxes topic says ``unit`` is removed (no source runs it)."""
    if read_changes(kafka).get(unit) != REMOVED:
        raise ConfigError(
            f"{unit} is not stopped: run `mailtap mailboxes remove {unit.source} "
            f"{unit.account} {unit.folder}` first (a running source keeps its cursor in memory "
            f"and would write it again), then this command"
        )


def forget_cursor(kafka: KafkaSettings, unit: WorkUnit) -> None:
    """A tombstone for the mailbox's cursor: its next start begins where ``start:`` says."""
    _tombstones(kafka, kafka.topics.offsets, [cursor_key(unit)])


@dataclass
class PurgePlan:
    """What a purge deletes: the keys to tombstone, the blobs to delete, what stays shared."""

    unit: WorkUnit
    keys: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    shared_blobs: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "mailbox": str(self.unit),
            "keys": self.keys,
            "blobs": self.blobs,
            "shared_blobs_kept": self.shared_blobs,
        }


def plan_purge(records: Sequence[TopicRecord], unit: WorkUnit) -> PurgePlan:
    """The keys of ``unit`` and the blobs only they refer to, from ``mail.events``' records in
    offset order per partition (the newest record of a key decides where the mail is)."""
    newest: dict[str, dict[str, Any] | None] = {}
    uris_of: dict[str, set[str]] = {}
    for record in records:
        if record.key is None:
            continue
        newest[record.key] = record.value
        if record.value is not None:
            uris_of.setdefault(record.key, set()).update(blob_uris(record.value))
    kind = SOURCE_KINDS.get(unit.source, unit.source.upper())
    keys = sorted(
        key
        for key, value in newest.items()
        if value is not None
        and value.get("account") == unit.account
        and (value.get("source") or {}).get("folder") == unit.folder
        and (value.get("source") or {}).get("kind") == kind
    )
    purged = set(keys)
    staying = [value for key, value in newest.items() if key not in purged and value is not None]
    kept_uris = {uri for value in staying for uri in blob_uris(value)}
    kept_files = {_blob_file(uri) for uri in kept_uris}
    candidates = {uri for key in keys for uri in uris_of.get(key, ())}
    blobs = sorted(u for u in candidates if u not in kept_uris and _blob_file(u) not in kept_files)
    shared = sorted(candidates - set(blobs))
    return PurgePlan(unit, keys, blobs, shared)


def blob_uris(value: dict[str, Any]) -> set[str]:
    """The claim-check URIs a MailEvent refers to: its raw mail and its attachments."""
    uris = {str(a["uri"]) for a in value.get("attachments") or () if a.get("uri")}
    raw = value.get("raw_ref")
    if raw and raw.get("uri"):
        uris.add(str(raw["uri"]))
    return uris


def _blob_file(uri: str) -> str:
    """The file or object a URI is in: a packed blob's URI without its ``#offset=..`` part."""
    return uri.split("#", 1)[0]


def execute_purge(
    kafka: KafkaSettings, claim_check: ClaimCheckSettings, plan: PurgePlan
) -> list[str]:
    """Tombstones for the plan's keys and its cursor, then delete its blobs (their files, once
    each). Returns the blob files or objects deleted; a file already gone counts as deleted."""
    files = blob_files(claim_check, plan.blobs)  # refused here, before anything is deleted
    keys = [k.encode() for k in plan.keys]
    _tombstones(kafka, kafka.topics.events, keys)
    if plan.unit.source == "imap":
        _forget_index_entries(kafka, plan.unit.account, plan.unit.folder, plan.keys)
    forget_cursor(kafka, plan.unit)
    return delete_blob_files(claim_check, files)


def _forget_index_entries(kafka: KafkaSettings, account: str, folder: str, keys: list[str]) -> None:
    """Tombstones for the keys' records of ``folder`` on the IMAP key index changelog
    (connectors/imap/KEYS.md), on the account's partition, as the source writes them when a
    mail leaves the folder: a folder added again later is new mail, not moves of known keys."""
    from connectors.core.kafka.clients import admin_client
    from connectors.imap.indexlog import location_key, partition_of

    topic = kafka.topics.imap_index
    described = admin_client(kafka).list_topics(topic, timeout=30).topics.get(topic)
    if described is None or described.error is not None or not keys:
        return  # no changelog: this deployment's IMAP index is rebuilt from mail.events
    partition = partition_of(account, len(described.partitions))
    records = [location_key(key, folder).encode() for key in keys]
    _tombstones(kafka, topic, records, partition=partition)


def blob_files(claim_check: ClaimCheckSettings, uris: Iterable[str]) -> list[str]:
    """The files and objects the URIs are in, each once; a URI this configuration cannot
    delete (another store, outside its root) raises with what to change."""
    files = sorted({_blob_file(uri) for uri in uris})
    for uri in files:
        scheme = urlsplit(uri).scheme
        if scheme == "file":
            _local_path(claim_check, uri)
        elif scheme != "s3":
            raise ConfigError(f"cannot delete claim-check blob {uri}: neither file:// nor s3://")
    return files


def delete_blob_files(claim_check: ClaimCheckSettings, files: list[str]) -> list[str]:
    """Delete each file:// file and s3:// object; one already gone counts as deleted."""
    for uri in files:
        if urlsplit(uri).scheme == "file":
            _local_path(claim_check, uri).unlink(missing_ok=True)
    remote = [uri for uri in files if urlsplit(uri).scheme == "s3"]
    if remote:
        _delete_s3(claim_check, remote)
    return files


def _local_path(claim_check: ClaimCheckSettings, uri: str) -> Path:
    root = Path(unquote(urlsplit(claim_check.url).path)).resolve()
    if claim_check.url.startswith("file://./"):  # the default: relative to the working dir
        root = Path(claim_check.url.removeprefix("file://")).resolve()
    path = Path(unquote(urlsplit(uri).path)).resolve()
    if not path.is_relative_to(root):
        raise ConfigError(
            f"blob {uri} is outside the claim-check store {root} (claim_check.url); run the "
            f"purge with the configuration of the sources that wrote it"
        )
    return path


def _delete_s3(claim_check: ClaimCheckSettings, uris: list[str]) -> list[str]:
    from connectors.core.claimcheck.s3 import s3_client

    client = s3_client(claim_check.s3)
    for uri in uris:
        parts = urlsplit(uri)
        client.delete_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"))
    return uris


def _tombstones(
    kafka: KafkaSettings, topic: str, keys: list[bytes], *, partition: int | None = None
) -> None:
    if not keys:
        return
    producer = Producer(producer_config(kafka))
    for key in keys:
        if partition is None:
            producer.produce(topic, key=key, value=None)
        else:
            producer.produce(topic, key=key, value=None, partition=partition)
        producer.poll(0)
    if producer.flush(FLUSH_TIMEOUT_S) != 0:
        raise TimeoutError(f"tombstones to {topic} not acknowledged within {FLUSH_TIMEOUT_S:.0f}s")
