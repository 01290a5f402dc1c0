"""The soak's independent verifier: what every reader of mailtap's topics must be able to rely on.

Independent on purpose: it imports nothing of ``connectors``, ``streams`` or the rest of
``mailtap`` (an import-linter contract keeps it so). It decodes records with fastavro and the
``schemas/*.avsc`` files, reads Kafka with its own read_committed confluent-kafka consumer and the
mailboxes with imapclient. A bug shared by the writers and a checker built on their code would
hide itself; this one has to be fooled separately.

`Ledger` is pure: records go in (`event`, `command`, `delivery`, `relayed`), `continuous()`
lists what is wrong whatever the timing, `final(server)` what is wrong once the run is quiet and
``server`` (the mailboxes as read at the end) is the truth. Each finding is a `Violation` with a
rule name and the key it is about; the unit tests feed crafted records.

Rules (issue 25):

- ``missing-key``: a mail on the server has no live key; ``duplicate-key``: it has more than one;
- ``unknown-mail``: an event for a Message-ID the workload never put on the server;
- ``missing-tombstone``: a live key for a mail gone from every watched folder; ``stale-state``:
  the last event's folder or flags differ from the server's;
- ``no-final-delivery`` / ``two-final-deliveries``: per command, exactly one of SENT, FAILED,
  SUPPRESSED (or a BOUNCED that is not the DSN of an earlier SENT);
- ``extra-copy``: the relay got a command's mail more than once without an UNKNOWN event for it;
  ``too-many-copies``: more resent copies than the sinks' pool size per disruption;
- ``step-twice``: one workflow step of one mail with two command ids;
- ``unthreaded``: a relayed reply whose In-Reply-To/References do not name the mail it answers.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro

#: Final outcomes of the sink; BOUNCED is final too unless it is the DSN of an earlier SENT.
SINK_FINAL = frozenset({"SENT", "FAILED", "SUPPRESSED"})
IGNORED_FLAGS = frozenset({"\\Recent"})


@dataclass(frozen=True)
class Violation:
    rule: str
    subject: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "subject": self.subject, "detail": self.detail}


@dataclass(frozen=True)
class ServerMail:
    """One mail as the IMAP server has it at the end."""

    account: str
    message_id: str
    folder: str
    flags: frozenset[str]


def normalize_mid(value: str | None) -> str:
    """``<Id@Host>`` -> ``Id@host``: the left part is case-sensitive, the domain is not."""
    text = (value or "").strip().strip("<>").strip()
    left, at, right = text.rpartition("@")
    return f"{left}@{right.lower()}" if at else text


@dataclass
class Ledger:
    """Everything the verifier has read, and the rules over it."""

    #: Message-IDs (normalized) the workload appended, per account
    known: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: key -> last value (None: tombstone), in the order read (per partition = per key)
    last: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    events_seen: int = 0
    unknown: dict[str, str] = field(default_factory=dict)
    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: dict[tuple[str, str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    deliveries: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: command id -> how many copies the relay accepted
    copies: Counter[str] = field(default_factory=Counter)
    relayed: list[dict[str, Any]] = field(default_factory=list)
    #: command ids whose relayed copy was checked for threading
    threading_checked: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)

    # --- input ------------------------------------------------------------------------------

    def appended(self, account: str, message_id: str) -> None:
        with self.lock:
            self.known[account].add(normalize_mid(message_id))

    def event(self, key: str, value: dict[str, Any] | None) -> None:
        with self.lock:
            self.events_seen += 1
            self.last[key] = value
            if value is not None:
                mid = normalize_mid(value.get("message_id"))
                if mid not in self.known.get(value["account"], set()):
                    self.unknown[key] = mid

    def command(self, value: dict[str, Any]) -> None:
        with self.lock:
            command_id = value["command_id"]
            self.commands[command_id] = value
            step = (value.get("event_key") or "", value["workflow"], value["step"])
            self.steps[step].add(command_id)

    def delivery(self, value: dict[str, Any]) -> None:
        with self.lock:
            self.deliveries[value["command_id"]].append(value["status"])

    def relayed_mail(self, message_id: str, in_reply_to: str, references: Iterable[str]) -> None:
        """A mail the relay accepted; the sink's Message-ID is ``mailtap.<token>@<domain>``."""
        with self.lock:
            command_id = command_id_of(message_id)
            self.copies[command_id] += 1
            self.relayed.append(
                {
                    "command_id": command_id,
                    "in_reply_to": normalize_mid(in_reply_to),
                    "references": [normalize_mid(r) for r in references],
                }
            )

    # --- rules ------------------------------------------------------------------------------

    def continuous(self, pool_size: int = 0, disruptions: int = -1) -> list[Violation]:
        """Violations whatever the moment: they can never be repaired by waiting."""
        with self.lock:
            found = [
                Violation("unknown-mail", key, f"event for Message-ID {mid!r} never appended")
                for key, mid in sorted(self.unknown.items())
            ]
            found += self._duplicate_live_keys()
            for command_id, statuses in sorted(self.deliveries.items()):
                finals = final_outcomes(statuses)
                if len(finals) > 1:
                    found.append(
                        Violation(
                            "two-final-deliveries", command_id, f"final events {finals} {statuses}"
                        )
                    )
            for (event_key, workflow, step), ids in sorted(self.steps.items()):
                if len(ids) > 1:
                    found.append(
                        Violation(
                            "step-twice",
                            f"{event_key} {workflow}/{step}",
                            f"command ids {sorted(ids)}",
                        )
                    )
            found += self._copies(pool_size, disruptions)
            found += self._threading()
            return found

    def final(
        self, server: Iterable[ServerMail], pool_size: int = 0, disruptions: int = -1
    ) -> list[Violation]:
        """Every rule, with ``server`` as the truth; call once nothing moves any more."""
        with self.lock:
            found = self.continuous(pool_size, disruptions)
            live: dict[tuple[str, str], list[str]] = defaultdict(list)
            for key, value in self.last.items():
                if value is not None:
                    live[(value["account"], normalize_mid(value.get("message_id")))].append(key)
            on_server = {(m.account, normalize_mid(m.message_id)): m for m in server}
            for ident, mail in sorted(on_server.items()):
                keys = live.get(ident, [])
                if not keys:
                    found.append(Violation("missing-key", "/".join(ident), "no live key"))
                    continue
                value = self.last[keys[0]]
                assert value is not None
                folder = value["source"]["folder"]
                flags = frozenset(value.get("flags") or ()) - IGNORED_FLAGS
                if folder != mail.folder or flags != mail.flags - IGNORED_FLAGS:
                    found.append(
                        Violation(
                            "stale-state",
                            keys[0],
                            f"last event {folder} {sorted(flags)}, server {mail.folder} "
                            f"{sorted(mail.flags - IGNORED_FLAGS)}",
                        )
                    )
            for ident, keys in sorted(live.items()):
                if ident not in on_server:
                    found += [
                        Violation("missing-tombstone", k, "live key, mail gone from the server")
                        for k in keys
                    ]
            for command_id in sorted(self.commands):
                if not final_outcomes(self.deliveries.get(command_id, [])):
                    statuses = self.deliveries.get(command_id, [])
                    found.append(Violation("no-final-delivery", command_id, f"events {statuses}"))
            return found

    def _duplicate_live_keys(self) -> list[Violation]:
        live: dict[tuple[str, str], list[str]] = defaultdict(list)
        for key, value in self.last.items():
            if value is not None:
                live[(value["account"], normalize_mid(value.get("message_id")))].append(key)
        return [
            Violation("duplicate-key", "/".join(ident), f"live keys {sorted(keys)}")
            for ident, keys in sorted(live.items())
            if len(keys) > 1
        ]

    def _copies(self, pool_size: int, disruptions: int) -> list[Violation]:
        found = []
        extra = 0
        for command_id, count in sorted(self.copies.items()):
            if count <= 1:
                continue
            extra += count - 1
            if "UNKNOWN" not in self.deliveries.get(command_id, []):
                found.append(
                    Violation("extra-copy", command_id, f"{count} copies, no UNKNOWN event")
                )
        if disruptions >= 0 and extra > pool_size * disruptions:
            found.append(
                Violation(
                    "too-many-copies",
                    "relay",
                    f"{extra} resent copies > pool size {pool_size} x {disruptions} disruptions",
                )
            )
        return found

    def _threading(self) -> list[Violation]:
        found = []
        by_mid: dict[str, dict[str, Any] | None] = {}
        for value in self.last.values():
            if value is not None:
                by_mid[normalize_mid(value.get("message_id"))] = value
        for mail in self.relayed:
            command = self.commands.get(mail["command_id"])
            if command is None or command.get("in_reply_to") is None:
                continue  # not read yet, or a mail that starts a thread (a forward)
            answered = normalize_mid(command["in_reply_to"])
            refs = mail["references"]
            if mail["in_reply_to"] != answered or not refs or refs[-1] != answered:
                found.append(
                    Violation(
                        "unthreaded",
                        mail["command_id"],
                        f"In-Reply-To {mail['in_reply_to']!r}, References {refs}, "
                        f"answers {answered!r}",
                    )
                )
        return found

    def figures(self) -> dict[str, Any]:
        with self.lock:
            statuses: Counter[str] = Counter()
            for values in self.deliveries.values():
                statuses.update(set(values))
            return {
                "events_read": self.events_seen,
                "keys": len(self.last),
                "live_keys": sum(1 for v in self.last.values() if v is not None),
                "tombstoned_keys": sum(1 for v in self.last.values() if v is None),
                "commands": len(self.commands),
                "commands_with_status": dict(statuses),
                "relayed_mails": sum(self.copies.values()),
                "resent_copies": sum(c - 1 for c in self.copies.values() if c > 1),
            }


def final_outcomes(statuses: list[str]) -> list[str]:
    """The final outcomes in a command's delivery events, in order (a DSN's BOUNCED after a
    SENT is the same delivery's later news, not a second outcome)."""
    finals: list[str] = []
    for status in statuses:
        if status in SINK_FINAL or (status == "BOUNCED" and "SENT" not in finals):
            finals.append(status)
    return finals


def command_id_of(message_id: str) -> str:
    """The command id in the sink's Message-ID ``<mailtap.{token}@{domain}>`` (the token is the
    command id, or ``b32.`` + base32 of it: connectors/smtp/README.md)."""
    import base64

    local = normalize_mid(message_id).rpartition("@")[0]
    token = local.removeprefix("mailtap.")
    if token.startswith("b32."):
        data = token[4:].upper()
        return base64.b32decode(data + "=" * (-len(data) % 8)).decode()
    return token


# --- decoding ---------------------------------------------------------------------------------


class Decoder:
    """Avro decoding from the schema files alone: the Confluent wire format (magic 0, a 4-byte
    schema id) or single-object encoding (C3 01, an 8-byte fingerprint), then the Avro body."""

    def __init__(self, schema_dir: Path) -> None:
        named: dict[str, Any] = {}
        fastavro.schema.load_schema(
            str(schema_dir / "io.mailtap.v1.Address.avsc"), named_schemas=named
        )
        self.schemas = {
            name: fastavro.parse_schema(
                json.loads((schema_dir / f"{name}.avsc").read_text()), named_schemas=dict(named)
            )
            for name in ("MailEvent", "ReplyCommand", "DeliveryEvent")
        }

    def decode(self, schema: str, data: bytes) -> dict[str, Any]:
        if data[:1] == b"\x00":
            body = data[5:]
        elif data[:2] == b"\xc3\x01":
            body = data[10:]
        else:
            raise ValueError(f"unknown framing {data[:2]!r}")
        value = fastavro.schemaless_reader(io.BytesIO(body), self.schemas[schema], None)
        if not isinstance(value, dict):
            raise ValueError(f"{schema} decoded to {type(value).__name__}")
        return value


# --- reading ----------------------------------------------------------------------------------


class TopicReader:
    """Reads mail.events, mail.commands and mail.delivery (read_committed) into a `Ledger` on a
    thread of its own."""

    def __init__(
        self, bootstrap: str, topics: Mapping[str, str], ledger: Ledger, decoder: Decoder
    ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.ledger = ledger
        self.decoder = decoder
        #: topic -> schema name
        self.topics = dict(topics)
        self.decode_errors: list[str] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"soak-verifier-{time.time_ns()}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "log_level": 0,
                "topic.metadata.refresh.interval.ms": 5000,
            }
        )
        # Assigned, not subscribed: no group coordinator between the verifier and the records
        # (a broker restart reloads the coordinators; the verifier must not depend on it).
        partitions = []
        for topic in self.topics:
            meta = self._consumer.list_topics(topic, timeout=30).topics[topic]
            partitions += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        self._consumer.assign(partitions)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-verifier")

    def start(self) -> TopicReader:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    continue
                self._take(msg.topic() or "", msg.key(), msg.value())
        self._consumer.close()

    def _take(self, topic: str, key: bytes | None, raw: bytes | None) -> None:
        schema = self.topics[topic]
        try:
            value = None if raw is None else self.decoder.decode(schema, raw)
        except Exception as exc:  # a record nobody can read is itself a finding
            self.decode_errors.append(f"{topic} {key!r}: {exc!r}")
            return
        if schema == "MailEvent":
            self.ledger.event((key or b"").decode(), value)
        elif value is not None and schema == "ReplyCommand":
            self.ledger.command(value)
        elif value is not None:
            self.ledger.delivery(value)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def read_server(
    host: str, port: int, accounts: Mapping[str, tuple[str, str]], folders: Iterable[str]
) -> list[ServerMail]:
    """Every mail of every watched folder, straight from the IMAP server (imapclient)."""
    from imapclient import IMAPClient

    mails = []
    for account, (username, password) in accounts.items():
        with IMAPClient(host, port=port, ssl=False, timeout=30) as client:
            client.login(username, password)
            for folder in folders:
                if not client.folder_exists(folder):
                    continue
                client.select_folder(folder, readonly=True)
                uids = client.search("ALL")
                for start in range(0, len(uids), 500):
                    chunk = uids[start : start + 500]
                    fetched = client.fetch(
                        chunk, ["FLAGS", "BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)]"]
                    )
                    for data in fetched.values():
                        header = data.get(b"BODY[HEADER.FIELDS (MESSAGE-ID)]", b"").decode(
                            "ascii", "replace"
                        )
                        _, _, mid = header.partition(":")
                        flags = frozenset(
                            f.decode() if isinstance(f, bytes) else str(f) for f in data[b"FLAGS"]
                        )
                        mails.append(ServerMail(account, mid.strip(), folder, flags))
    return mails
