"""``mailtap bench ingest``: IMAP -> Kafka against the local Dovecot and Kafka, with its baselines.

One run measures, on the same freshly populated mailbox:

1. raw imapclient FETCH throughput (the baseline: BODY.PEEK[] FLAGS INTERNALDATE MODSEQ in
   batches, nothing else), and the naive poller (`mailtap.bench.naivepoller`: imapclient FETCH
   -> confluent-kafka producer, no parse, no transaction) with its CPU per mail;
2. mailtap ingest throughput, exactly-once into Kafka: the real ``mailtap run imap-source``
   process (parse, claim-check, Avro, one transaction per batch with the cursor), counted as
   committed records seen by a read_committed consumer; and its ratio to (1);
3. peak RSS of that process during the backfill (VmHWM) and RSS samples along the way (flat =
   not growing with the mailbox);
4. IDLE latency: APPEND -> event committed in Kafka, next to the raw IDLE notification latency
   (APPEND -> ``* n EXISTS`` on a plain imapclient IDLE) for the same APPENDs.

The mailbox is populated by writing maildir files directly and ``doveadm force-resync``
(APPEND is ~150 mail/s on maildir, PITFALLS.md); on Courier (maildir, no index) by the files
alone; on Cyrus and GreenMail by APPEND. ``--imap-server cyrus|courier|dovecot-minimal`` runs the same rounds
against that server of the dev stack (`mailtap.dev.imapservers`), started next to the running
Kafka: the ratio is always to raw FETCH on the same server. Figures, not assertions.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]  # re-exported, no __all__
from imapclient import IMAPClient

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import admin_client, consumer_config, producer_config
from connectors.core.kafka.topics import ensure_topic_specs, ensure_topics
from connectors.core.mail import parse_mail
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.indexlog import topic_spec as index_topic_spec
from mailtap.bench.bytecode import compile_ahead
from mailtap.bench.naivepoller import naive_poll
from mailtap.dev import DevServices, ImapInfo, imapservers, process, status, up
from mailtap.dev.layout import DEFAULT_STATE_DIR, REPO_ROOT
from mailtap.dev.process import terminate

log = logging.getLogger(__name__)

BATCH = 200
BODY_BYTES = 4_500  # with headers ~5 KB per mail, as in PITFALLS.md's FETCH figures
IDLE_SAMPLES = 40
#: Fewer new-mail samples where each takes seconds: Courier's IDLE polls the maildir every
#: IMAP_IDLE_TIMEOUT (10 s in the dev instance), and a server without IDLE is polled.
SLOW_NEW_MAIL_SAMPLES = 12
#: ``poll_interval_seconds`` of the source on a server without IDLE (the default is 30 s).
BENCH_POLL_INTERVAL_S = 5.0
#: The source made no progress for this long: report it instead of waiting forever.
STALL_S = 120.0
#: A new-mail sample not on Kafka within this long is missed (counted, not averaged in).
NEW_MAIL_TIMEOUT_S = 30.0
#: How much longer missed samples are waited for after the last one: past the source's light
#: sync (uidvalidity_check_seconds, 10 s), which finds any mail IDLE did not announce.
MISSED_GRACE_S = 45.0
#: Dovecot's warning when it cannot watch a mailbox for IDLE: it then looks for changes only
#: every ``mailbox_idle_check_interval`` (30 s by default). The limit is per uid and machine-wide.
DOVECOT_NO_INOTIFY = "Inotify instance limit"
ACCOUNT = "bench"
#: The issue's target: ingest at >= 80 % of the raw FETCH rate.
TARGET_RATIO = 0.8
#: Seconds of transactional produce that warm a broker up before the rounds (see _warm_broker).
WARM_UP_S = 45.0
#: The broker's CPU per warm-up record is reported over windows of this length.
WARM_UP_WINDOW_S = 5.0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


#: Run against the services of another state dir (e.g. the test suite's kept services).
ENV_STATE_DIR = "MAILTAP_BENCH_STATE_DIR"
#: Where the claim-check blobs go (default: a temporary folder on disk). Pointing it at tmpfs
#: (/dev/shm) shows what the per-blob fsync costs.
ENV_CLAIMS_DIR = "MAILTAP_BENCH_CLAIMS_DIR"
#: A command the source runs under, for profiling, e.g.
#: ``py-spy record --subprocesses -f raw -o /tmp/source.prof --``.
ENV_WRAP_SOURCE = "MAILTAP_BENCH_WRAP_SOURCE"


def _services() -> DevServices:
    state_dir = Path(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR)
    running = status(state_dir)
    if running is not None:
        return running
    if os.environ.get(ENV_STATE_DIR):
        # Someone else's services (shared by tests and other benches): up() would stop a set
        # that is only slow to answer (a broker busy loading its partitions) and start afresh.
        raise RuntimeError(
            f"the services in {state_dir} ({ENV_STATE_DIR}) do not all answer; start them with "
            f"`mailtap dev up --state-dir {state_dir}` or unset {ENV_STATE_DIR}"
        )
    _say(f"starting local services in {state_dir} ...")
    return up(state_dir)


def _mail(tag: str, i: int) -> bytes:
    body = (f"line {i} of the benchmark mail, some text to make it realistic. " * 80)[:BODY_BYTES]
    return (
        f"Message-ID: <bench-{i}-{tag}@example.com>\r\n"
        f"From: Sender {i} <sender{i}@example.com>\r\nTo: bench@example.com\r\n"
        f"Subject: benchmark mail {i}\r\nDate: Sun, 29 Nov 2026 12:00:00 +0000\r\n"
        f"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n"
    ).encode()


def _populate(info: DevServices, username: str, password: str, tag: str, count: int) -> float:
    """Write ``count`` mails straight into the user's maildir, then let Dovecot index them."""
    started = time.monotonic()
    client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
    client.login(username, password)
    client.select_folder("INBOX")  # creates the maildir
    client.logout()
    if info.imap.kind in ("cyrus", "greenmail"):
        return _populate_by_append(info, username, password, tag, count, started)
    maildir = info.imap.mail_dir / username / "Maildir"
    owner = maildir.stat()
    host = socket.gethostname()
    now = int(time.time())
    for i in range(count):
        data = _mail(tag, i)
        # S= is the file size, W= the size with CRLF line ends (RFC822.SIZE), as Dovecot's own
        # delivery writes them; Dovecot trusts both (a wrong one is a "broken physical size").
        # The mails have CRLF line ends already, so W = S.
        path = maildir / "cur" / f"{now}.M{i}P{os.getpid()}.{host},S={len(data)},W={len(data)}:2,"
        path.write_bytes(data)
        os.chown(path, owner.st_uid, owner.st_gid)
    if info.imap.kind.startswith("dovecot"):
        info.doveadm("force-resync", "-u", username, "INBOX")
    # Courier reads the maildir itself and gives the files UIDs at the next SELECT.
    return time.monotonic() - started


def _populate_by_append(
    info: DevServices, username: str, password: str, tag: str, count: int, started: float
) -> float:
    """APPEND one mail per command (Cyrus keeps its own index, GreenMail its mail in memory;
    imapclient's MULTIAPPEND gets "BAD Missing required argument" from Cyrus)."""
    client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
    client.login(username, password)
    for i in range(count):
        client.append("INBOX", _mail(tag, i))
    client.logout()
    return time.monotonic() - started


@dataclass
class RawFetch:
    """The baseline loop's rate and what it cost: CPU seconds of this process (the imapclient
    client) and of Dovecot while it ran."""

    rate: float
    fetched: int
    client_cpu_s: float
    dovecot_cpu_s: float


def _raw_fetch_rate(
    info: DevServices, username: str, password: str, parse: bool = False
) -> RawFetch:
    """Mails/s of a bare imapclient FETCH loop; with ``parse``, plus the shared MIME parser
    (no claim-check store, no Kafka): what is left is the cost of exactly-once and blobs."""
    client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
    client.login(username, password)
    items = [b"BODY.PEEK[]", b"FLAGS", b"INTERNALDATE"]
    if b"CONDSTORE" in client.capabilities():
        client.enable("CONDSTORE")
        items.append(b"MODSEQ")  # what the source asks for where the server has it
    client.select_folder("INBOX", readonly=True)
    uids = client.search(["ALL"])
    dovecot_before = _cpu_groups(info)["dovecot"]
    cpu_before = time.process_time()
    started = time.monotonic()
    fetched = 0
    for i in range(0, len(uids), BATCH):
        for item in client.fetch(uids[i : i + BATCH], items).values():
            fetched += len(item[b"BODY[]"]) > 0
            if parse:
                parse_mail(
                    item[b"BODY[]"],
                    account=ACCOUNT,
                    source={"kind": "IMAP", "folder": "INBOX"},
                    flags=[],
                    internal_date=None,
                    observed_at=dt.datetime.now(dt.UTC),
                )
    elapsed = time.monotonic() - started
    client_cpu = time.process_time() - cpu_before
    dovecot_cpu = _cpu_groups(info)["dovecot"] - dovecot_before
    client.logout()
    return RawFetch(fetched / elapsed, fetched, client_cpu, dovecot_cpu)


def _account(
    info: DevServices, username: str, password: str, name: str = ACCOUNT
) -> dict[str, Any]:
    """A bench mailbox of the dev Dovecot as an ``imap.accounts`` entry."""
    return {
        "name": name,
        "host": info.imap.host,
        "port": info.imap.port,
        "security": "plain",
        "username": username,
        "password": password,
    }


def _connection_fetch_rate(info: DevServices, username: str, password: str) -> float:
    """Mails/s of the source's own FETCH (strict fast parse of imaplib's data, imaplib's
    debug formatting off): what the ingest pipeline pays for fetching."""
    account = ImapAccountSettings.model_validate(_account(info, username, password))
    conn = ImapConnection(account, connect_timeout=10, read_timeout=60)
    conn.connect()
    conn.login()
    conn.enable_condstore()
    conn.select("INBOX", readonly=True)
    uids = conn.uids_from(1)
    started = time.monotonic()
    fetched = sum(len(conn.fetch(uids[i : i + BATCH])) for i in range(0, len(uids), BATCH))
    elapsed = time.monotonic() - started
    conn.logout()
    return fetched / elapsed


def _backfill_started(log_path: Path) -> float | None:
    """When the source logged ``... mails to read`` (epoch seconds), from its log line's
    timestamp (``%Y-%m-%d %H:%M:%S,mmm``, local time)."""
    for line in log_path.read_text(errors="replace").splitlines():
        if "mails to read" in line:
            try:
                stamp, millis = line[:23].split(",")
                return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1e3
            except ValueError:
                return None
    return None


def _cpu_groups(info: DevServices, source_pid: int | None = None) -> dict[str, float]:
    """CPU seconds so far of this run's Dovecot and Kafka broker, of this process (its consumer
    of the events topic, which measures the arrivals) and, given ``source_pid``, of the source
    and its parse processes.

    Only the services of this run count: each is a process group that `mailtap.dev` started
    (its pid is the group id), so another run's broker or Dovecot on a shared machine never
    does — summing every process named ``kafka.Kafka`` once gave a negative broker CPU when
    someone else's broker exited. A broker someone else runs (``MAILTAP_KAFKA_BOOTSTRAP``) is
    not measured: no ``kafka`` entry.
    """
    groups = {"bench": process.cpu_seconds(os.getpid())}
    groups["dovecot"] = process.group_cpu_seconds(info.imap.pid)
    if info.kafka.pid is not None:
        groups["kafka"] = process.group_cpu_seconds(info.kafka.pid)
    if source_pid is not None:
        groups["source"] = process.cpu_seconds(source_pid)
        # The parse processes: the live ones, and those the source has already reaped.
        reaped = process.cpu_seconds(source_pid, reaped_children=True) - groups["source"]
        groups["parse_processes"] = reaped + sum(
            process.cpu_seconds(pid, reaped_children=True) for pid in _children(source_pid)
        )
    return groups


@dataclass
class Arrivals:
    """Committed records on the events topic, as a read_committed consumer sees them."""

    kafka: KafkaSettings
    times: dict[str, float] = field(default_factory=dict)
    first: float | None = None
    last: float | None = None
    last_wall: float | None = None
    #: Why the consumer thread ended early: the bench checks it rather than time out sample
    #: after sample on a consumer that is gone.
    failed: Exception | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        try:
            self._consume()
        except Exception as exc:  # said by _check_alive, in the bench's own thread
            self.failed = exc

    def _consume(self) -> None:
        topic = self.kafka.topics.events
        consumer = Consumer(consumer_config(self.kafka, f"bench-{uuid.uuid4().hex[:8]}"))
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        try:
            while not self.stop.is_set():
                # Drain what is there without waiting; when nothing is, wait for one record.
                # (consume(n, timeout) returns only when n records came or the timeout passed:
                # a lone record, an IDLE mail, would be timed up to that timeout late.)
                msgs = consumer.consume(1000, 0)
                if not msgs:
                    msg = consumer.poll(0.05)
                    msgs = [msg] if msg is not None else []
                for msg in msgs:
                    err = msg.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(str(err))
                    key = msg.key()
                    if err is None and key is not None:
                        now = time.monotonic()
                        with self.lock:
                            self.times[key.decode()] = now
                            self.first = self.first or now
                            self.last = now
                            self.last_wall = time.time()
        finally:
            consumer.close()

    def count(self) -> int:
        with self.lock:
            return len(self.times)


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _rss_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


class RawIdle:
    """A plain imapclient IDLE on the same mailbox: when does ``* n EXISTS`` arrive?"""

    def __init__(self, info: DevServices, username: str, password: str) -> None:
        self.client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
        self.client.login(username, password)
        self.client.select_folder("INBOX", readonly=True)
        self.seen = threading.Event()
        self.at = 0.0
        self._stop = threading.Event()
        self._idling = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        # The first APPEND only once IDLE is on: GreenMail sends an EXISTS that comes before
        # its "+ idling" as is, which imapclient's idle() refuses ("Unexpected IDLE response").
        self._idling.wait(10)

    def _loop(self) -> None:
        self.client.idle()
        self._idling.set()
        while not self._stop.is_set():
            for response in self.client.idle_check(timeout=0.2):
                if len(response) > 1 and response[1] == b"EXISTS":
                    self.at = time.monotonic()
                    self.seen.set()
        self.client.idle_done()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.logout()


def _cpu_line(figures: dict[str, Any]) -> str:
    """One line for a log (CI's smoke run prints it): CPU per mail of the ingest and of the
    naive poller, by component."""
    ingest = figures.get("ingest_cpu_us_per_mail") or {}
    naive = figures["naive_poller_cpu_us_per_mail"]
    parts = ", ".join(f"{k} {v}" for k, v in ingest.items() if k != "total")
    return (
        f"CPU per mail: mailtap ingest {ingest.get('total')} µs ({parts}); naive poller "
        f"{naive['total']} µs (client {naive['client']}, kafka {naive['kafka']}, dovecot "
        f"{naive['dovecot']}); rate ratio to the naive poller {figures['ingest_to_naive_ratio']}"
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


ROUND_FIGURES = (
    "raw_fetch_mails_per_s",
    "naive_poller_mails_per_s",
    "ingest_mails_per_s",
    "ingest_to_raw_ratio",
    "ingest_to_naive_ratio",
    "ingest_cpu_us_per_mail",
    "naive_poller_cpu_us_per_mail",
    "first_event_s",
)


def bench_ingest(
    json_out: bool,
    mails: int,
    rounds: int = 3,
    warm_up_s: float = WARM_UP_S,
    imap_server: str = "dovecot",
) -> dict[str, Any]:
    """``rounds`` rounds, each on a fresh mailbox and topics: raw FETCH, then the ingest. The
    shared 2-core machine is noisy; the median ratio is the figure. The last round also
    measures IDLE latency (new-mail latency, polled where the server has no IDLE), and its
    full figures are printed. ``imap_server``: one of `mailtap.dev.imapservers.KINDS`."""
    with services_with(imap_server) as info:
        figures = _rounds(info, mails, rounds, warm_up_s)
    if not json_out:
        for name, value in figures.items():
            print(f"{name:40s} {value}")
    return figures


@contextmanager
def services_with(imap_server: str) -> Iterator[DevServices]:
    """The local services with the IMAP server ``imap_server``: the running set's own, or one
    started next to its Kafka for the block (and stopped after)."""
    imapservers.check_kind(imap_server)
    info = _services()
    if imap_server == info.imap.kind:
        yield info
        return
    _say(f"starting {imap_server} next to the running services ...")
    state = Path(tempfile.mkdtemp(prefix=f"mailtap-bench-{imap_server}-"))
    state.chmod(0o755)  # the server's unprivileged processes read under it
    port = process.free_port(info.imap.host)
    other = imapservers.start(imap_server, state, info.imap.host, port)
    try:
        yield replace(info, imap=_imap_info(other, info.imap.host, port))
    finally:
        process.stop_group(other.pid)
        shutil.rmtree(state, ignore_errors=True)


def _imap_info(started: imapservers.StartedImap, host: str, port: int) -> ImapInfo:
    return ImapInfo(
        host=host,
        port=port,
        accounts=(),
        pid=started.pid,
        log_path=started.log_path,
        config_path=started.config_path,
        passwd_file=started.passwd_file,
        mail_dir=started.mail_dir,
        kind=started.kind,
    )


def _rounds(info: DevServices, mails: int, rounds: int, warm_up_s: float) -> dict[str, Any]:
    # first_event_s times a deployed source's start: with its bytecode, as pip installs it.
    compiled = compile_ahead()
    warm_up = _warm_broker(info, warm_up_s) if warm_up_s > 0 else None
    results = []
    for number in range(1, rounds + 1):
        _say(f"round {number} of {rounds} ({info.imap.kind})")
        results.append(_round(info, mails, idle=number == rounds))
    figures = {"imap_server": info.imap.kind, **results[-1]}
    figures["broker_warm_up"] = warm_up
    figures["bytecode_compiled_ahead"] = compiled
    figures["rounds"] = [{name: r.get(name) for name in ROUND_FIGURES} for r in results]
    figures["ingest_to_raw_ratio_median"] = statistics.median(
        r["ingest_to_raw_ratio"] for r in results
    )
    figures["ingest_to_naive_ratio_median"] = statistics.median(
        r["ingest_to_naive_ratio"] for r in results
    )
    firsts = sorted(r["first_event_s"] for r in results)
    figures["first_event_s_median"] = statistics.median(firsts)
    figures["first_event_s_range"] = [firsts[0], firsts[-1]]
    return figures


def _broker_cpu(info: DevServices) -> float:
    """CPU seconds of this run's broker; 0.0 for a broker someone else runs (not measured)."""
    return _cpu_groups(info).get("kafka", 0.0)


def _warm_broker(info: DevServices, seconds: float) -> dict[str, Any]:
    """Transactional produce of bench-sized mails for ``seconds`` to a throwaway compacted
    topic, so the rounds meet a warm broker.

    A production broker is a long-running JVM whose hot paths are compiled; a broker the bench
    just started (or one that has seen little traffic) is not: its JIT compiles for the first
    few million records. Measured here (2 cores, lz4, 200-record transactions), its CPU per
    record fell from ~44 µs in the first 5 s to ~6 µs after 40 s, and the ingest's "kafka"
    share from ~50 to ~15 µs per mail. Without this, the ratio would measure the JIT.
    """
    _say(f"warming up the Kafka broker: {seconds:.0f} s of transactional produce ...")
    kafka = KafkaSettings(bootstrap_servers=info.bootstrap_servers)
    topic = f"mailtap.bench.warm-up-{uuid.uuid4().hex[:8]}"
    admin = admin_client(kafka)
    admin.create_topics(
        [NewTopic(topic, kafka.partitions, 1, config={"cleanup.policy": "compact"})]
    )[topic].result()
    producer = Producer(producer_config(kafka, transactional_id=topic))
    producer.init_transactions()
    values = [_mail(topic, i) for i in range(BATCH)]
    windows: list[float] = []
    sent = 0
    try:
        started = window_start = time.monotonic()
        cpu_start = window_cpu = _broker_cpu(info)
        window_sent = 0
        while time.monotonic() - started < seconds:
            producer.begin_transaction()
            for value in values:
                producer.produce(topic, key=f"k{sent}".encode(), value=value)
                producer.poll(0)
                sent += 1
            producer.commit_transaction()
            if time.monotonic() - window_start >= WARM_UP_WINDOW_S:
                cpu = _broker_cpu(info)
                windows.append(round((cpu - window_cpu) / (sent - window_sent) * 1e6, 1))
                window_start, window_cpu, window_sent = time.monotonic(), cpu, sent
        spent = _broker_cpu(info) - cpu_start
    finally:
        producer.flush(10)
        admin.delete_topics([topic])
    if info.kafka.pid is None:
        _say("broker CPU not measured: the broker is not one this run started")
        return {"seconds": seconds, "records": sent, "broker_cpu_us_per_record": None}
    _say(f"broker CPU per record, {WARM_UP_WINDOW_S:.0f} s windows: {windows} µs")
    return {
        "seconds": seconds,
        "records": sent,
        "broker_cpu_us_per_record": round(spent / max(sent, 1) * 1e6, 1),
        "broker_cpu_us_per_record_windows": windows,
    }


def _delete_topics(kafka: KafkaSettings, tag: str) -> None:
    """A round's topics (named ``*.bench-<tag>``, the source's retry tiers included), once its
    figures are taken: a bench run must not grow the broker."""
    mark = f".bench-{tag}"
    delete_topics_where(kafka, lambda t: t.endswith(mark) or f"{mark}." in t)


def delete_topics_where(kafka: KafkaSettings, wanted: Callable[[str], bool]) -> None:
    """Delete the broker's topics whose name ``wanted`` accepts (a failure is logged)."""
    admin = admin_client(kafka)
    names = [t for t in admin.list_topics(timeout=30).topics if wanted(t)]
    if not names:
        return  # delete_topics refuses an empty list
    for future in admin.delete_topics(names, operation_timeout=30).values():
        try:
            future.result()
        except KafkaException as exc:
            log.warning("bench topic not deleted: %s", exc)


def _round(
    info: DevServices, mails: int, idle: bool, client: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One round; ``client``: ``kafka`` settings the source connects with instead of the
    services' PLAINTEXT listener (a secured listener of the same broker: `mailtap.bench.tls_cost`);
    topics and the arrival counter stay on ``info``'s bootstrap."""
    tag = uuid.uuid4().hex[:8]
    username, password = f"bench-{tag}@example.com", "bench"
    info.add_user(username, password)
    work = Path(tempfile.mkdtemp(prefix="mailtap-bench-ingest-"))
    names = {f: f"{getattr(TopicNames(), f)}.bench-{tag}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(bootstrap_servers=info.bootstrap_servers, topics=TopicNames(**names))
    ensure_topics(kafka, retry_tiers=["1m"])
    # The key index changelog too, as `mailtap topics ensure` creates it with an imap section:
    # first_event_s is a start on a warm stack, not a topic's first seconds (a topic the
    # source itself creates answers NOT_LEADER for up to ~1 s while its leader settles).
    ensure_topic_specs(kafka, [index_topic_spec(kafka)])
    figures: dict[str, Any] = {
        "mails": mails,
        "batch_size": BATCH,
        "mail_bytes": len(_mail(tag, 0)),
    }

    _say(f"populating a mailbox with {mails} mails ...")
    figures["populate_seconds"] = round(_populate(info, username, password, tag, mails), 2)

    _say("baseline: raw imapclient FETCH ...")
    baseline = _raw_fetch_rate(info, username, password)
    raw_rate = baseline.rate
    figures["raw_fetch_mails_per_s"] = round(raw_rate, 1)
    figures["raw_fetched"] = baseline.fetched
    figures["raw_fetch_cpu_us_per_mail"] = {
        "client": round(baseline.client_cpu_s / baseline.fetched * 1e6, 1),
        "dovecot": round(baseline.dovecot_cpu_s / baseline.fetched * 1e6, 1),
    }
    _say("naive poller: imapclient FETCH -> producer (no parse, no transaction) ...")
    naive = naive_poll(
        info.imap.host,
        info.imap.port,
        username,
        password,
        kafka,
        f"mailtap.naive.bench-{tag}",
        lambda: _cpu_groups(info),
    )
    figures["naive_poller_mails_per_s"] = round(naive.rate, 1)
    figures["naive_poller_cpu_us_per_mail"] = naive.cpu_us_per_mail()
    _say("second baseline: raw FETCH + the shared parser (no Kafka, no claim-check) ...")
    parse_rate = _raw_fetch_rate(info, username, password, parse=True).rate
    figures["raw_fetch_and_parse_mails_per_s"] = round(parse_rate, 1)
    _say("third figure: mailtap's own FETCH path (ImapConnection.fetch), nothing else ...")
    figures["mailtap_fetch_mails_per_s"] = round(
        _connection_fetch_rate(info, username, password), 1
    )

    claims = Path(tempfile.mkdtemp(prefix="claims-", dir=os.environ.get(ENV_CLAIMS_DIR) or work))
    figures["claims_dir"] = str(claims.parent)
    config = {
        "kafka": {**kafka.model_dump(mode="json", exclude_none=True), **(client or {})},
        "claim_check": {"url": claims.as_uri()},
        "health": {"port": 0},
        "imap": {
            "accounts": [
                {**_account(info, username, password), "folders": ["INBOX"], "start": "all"}
            ],
            "batch_size": BATCH,
            "poll_interval_seconds": BENCH_POLL_INTERVAL_S,
        },
    }
    config_path = work / "mailtap.yaml"
    config_path.write_text(yaml.safe_dump(config))
    arrivals = Arrivals(kafka)
    consumer_thread = threading.Thread(target=arrivals.run, daemon=True)
    consumer_thread.start()

    _say("mailtap: exactly-once ingest (mailtap run imap-source) ...")
    log_file = open(work / "source.log", "wb")  # noqa: SIM115 - closed below
    spawned = time.monotonic()
    command = [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", str(config_path)]
    wrapper = os.environ.get(ENV_WRAP_SOURCE)
    proc = subprocess.Popen(
        [*wrapper.split(), *command] if wrapper else command,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    keep_work = False
    rss_samples: list[tuple[int, int]] = []
    next_sample = 0
    progressed, last_done = time.monotonic(), -1
    cpu_start: tuple[float, dict[str, float], int] | None = None
    # CPU per mail is counted once a tenth of the mails is on Kafka: the first events come
    # while the parse processes still start (their spawn and imports, ~1 s of CPU each, are
    # the start-up's, not a per-mail cost; counted from the first event they added ~750 µs
    # per mail to a 2,000-mail run).
    cpu_from = max(1, mails // 10)
    try:
        while arrivals.count() < mails:
            if cpu_start is None and arrivals.count() >= cpu_from:
                cpu_start = (time.monotonic(), _cpu_groups(info, proc.pid), arrivals.count())
            if proc.poll() is not None:
                raise RuntimeError(f"the source exited early; see {work / 'source.log'}")
            done = arrivals.count()
            if done != last_done:
                progressed, last_done = time.monotonic(), done
            elif time.monotonic() - progressed > STALL_S:
                raise RuntimeError(
                    f"no event committed for {STALL_S:.0f}s at {done}/{mails}; "
                    f"see {work / 'source.log'}"
                )
            if done >= next_sample:
                rss_samples.append((done, _rss_kb(proc.pid, "VmRSS")))
                next_sample += max(mails // 10, 1)
            time.sleep(0.05)
        finished = time.monotonic()
        if cpu_start is not None:
            # Cores each part kept busy while events arrived (2 cores in all here).
            used = _cpu_groups(info, proc.pid)
            span = max(finished - cpu_start[0], 1e-6)
            figures["ingest_cores_used"] = {
                name: round((used[name] - cpu_start[1][name]) / span, 2) for name in used
            }
            counted = max(arrivals.count() - cpu_start[2], 1)
            cost = {
                name: (used[name] - cpu_start[1][name]) / counted * 1e6
                for name in used
                if name != "bench"
            }
            # CPU per mail of each part while events arrived, and what the target rate would
            # take at that cost: past the machine's cores, the ratio cannot reach it here.
            figures["ingest_cpu_us_per_mail"] = {
                **{name: round(us, 1) for name, us in cost.items()},
                "total": round(sum(cost.values()), 1),
            }
            figures["cores_needed_at_target_ratio"] = round(
                sum(cost.values()) * TARGET_RATIO * raw_rate / 1e6, 2
            )
            figures["cores_here"] = os.cpu_count()
            figures["parse_processes_rss_mb"] = round(
                sum(_rss_kb(pid, "VmRSS") for pid in _children(proc.pid)) / 1024, 1
            )
        rss_samples.append((mails, _rss_kb(proc.pid, "VmRSS")))
        peak_backfill = _rss_kb(proc.pid, "VmHWM")
        assert arrivals.first is not None and arrivals.last is not None
        started = _backfill_started(work / "source.log")
        if started is not None and arrivals.last_wall is not None:
            # From the source's "N mails to read" (just before its first FETCH) to the last
            # event committed: like the raw FETCH loop, it includes filling the pipeline.
            ingest_rate = mails / max(arrivals.last_wall - started, 1e-6)
        else:  # pragma: no cover - the source logs that line at INFO
            ingest_rate = (mails - 1) / max(arrivals.last - arrivals.first, 1e-6)
            figures["ingest_rate_from_first_arrival"] = True
        figures["ingest_mails_per_s"] = round(ingest_rate, 1)
        # Issue 29 item 0: process spawn -> the first event visible (read_committed), on
        # whatever stack the bench runs (target <= 1 s on a warm dev stack).
        figures["first_event_s"] = round(arrivals.first - spawned, 2)
        figures["ingest_wall_seconds_incl_startup"] = round(finished - spawned, 2)
        figures["ingest_to_raw_ratio"] = round(ingest_rate / raw_rate, 3)
        figures["ingest_to_naive_ratio"] = round(ingest_rate / naive.rate, 3)
        _say(_cpu_line(figures))
        figures["ingest_to_fetch_and_parse_ratio"] = round(ingest_rate / parse_rate, 3)
        figures["peak_rss_mb"] = round(peak_backfill / 1024, 1)
        figures["rss_mb_samples"] = [[n, round(kb / 1024, 1)] for n, kb in rss_samples]

        if not idle:
            return figures
        appender = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
        appender.login(username, password)
        has_idle = b"IDLE" in appender.capabilities()
        samples = IDLE_SAMPLES if info.imap.kind == "dovecot" else SLOW_NEW_MAIL_SAMPLES
        what = "IDLE" if has_idle else f"polling every {BENCH_POLL_INTERVAL_S:g} s (no IDLE)"
        _say(f"new-mail latency ({what}) over {samples} APPENDs ...")
        figures["new_mail_by"] = what
        time.sleep(2.0)  # let the source settle into IDLE
        raw = RawIdle(info, username, password) if has_idle else None
        raw_lat: list[float] = []
        src_lat: list[float] = []
        missed: dict[str, float] = {}  # key -> when its APPEND was sent
        for i in range(samples):
            key = f"{ACCOUNT}/mid:bench-{mails + i}-{tag}@example.com"
            if raw is not None:
                raw.seen.clear()
            sent = time.monotonic()
            appender.append("INBOX", _mail(tag, mails + i))
            deadline = sent + NEW_MAIL_TIMEOUT_S
            while (
                key not in arrivals.times or (raw is not None and not raw.seen.is_set())
            ) and time.monotonic() < deadline:
                _check_alive(proc, arrivals, work)
                time.sleep(0.002)
            if key not in arrivals.times:
                missed[key] = sent
            else:
                src_lat.append((arrivals.times[key] - sent) * 1000)
                if raw is not None and raw.seen.is_set():
                    raw_lat.append((raw.at - sent) * 1000)
            time.sleep(0.1)
        appender.logout()
        if raw is not None:
            raw.close()
        if missed:
            # Late or never? A missed mail still comes by the source's next light sync or
            # catch-up; the figure says which, instead of a silent gap in the samples.
            until = time.monotonic() + MISSED_GRACE_S
            while time.monotonic() < until and not all(k in arrivals.times for k in missed):
                _check_alive(proc, arrivals, work)
                time.sleep(0.05)
            figures["new_mail_missed"] = len(missed)
            figures["new_mail_missed_arrived_after_s"] = [
                round(arrivals.times[k] - at, 1) if k in arrivals.times else None
                for k, at in missed.items()
            ]
            _say(
                f"{len(missed)} of {samples} new mails not on Kafka within "
                f"{NEW_MAIL_TIMEOUT_S:g} s; arrived after (s, None: not within "
                f"{MISSED_GRACE_S:g} s more): {figures['new_mail_missed_arrived_after_s']}"
            )
        if _dovecot_push_off(info, username):
            figures["dovecot_idle_push_off"] = True
            _say(
                "Dovecot could not watch this mailbox (its log: 'Inotify instance limit ... "
                "exceeded, disabling': fs.inotify.max_user_instances is per uid, machine-wide, "
                "and every dev and test Dovecot runs mail as nobody): its IDLE announces a "
                "change only at its mailbox_idle_check_interval (30 s), so the raw client waits "
                "that long and the source's figures are those of its light sync "
                "(uidvalidity_check_seconds, 10 s)"
            )
        figures["idle_samples"] = len(src_lat)
        figures["new_mail_to_kafka_ms_p50"] = (
            round(statistics.median(src_lat), 1) if src_lat else None
        )
        figures["new_mail_to_kafka_ms_max"] = round(max(src_lat), 1) if src_lat else None
        if src_lat and len(raw_lat) == len(src_lat):
            figures["raw_idle_latency_ms_p50"] = round(statistics.median(raw_lat), 1)
            figures["raw_idle_latency_ms_p99"] = round(_percentile(raw_lat, 0.99), 1)
            figures["idle_to_kafka_latency_ms_p50"] = round(statistics.median(src_lat), 1)
            figures["idle_to_kafka_latency_ms_p99"] = round(_percentile(src_lat, 0.99), 1)
            figures["idle_overhead_ms_p50"] = round(
                statistics.median(s - r for s, r in zip(src_lat, raw_lat, strict=True)), 1
            )
        figures["peak_rss_mb_overall"] = round(_rss_kb(proc.pid, "VmHWM") / 1024, 1)
        if missed:
            # Kept for a look at what the source did (its log is in work).
            keep_work = True
            figures["source_log"] = str(work / "source.log")
    except BaseException:
        keep_work = True
        _say(f"the round failed: the source's log is kept in {work / 'source.log'}")
        raise
    finally:
        terminate(proc)
        log_file.close()
        arrivals.stop.set()
        consumer_thread.join(10)
        if info.imap.kind.startswith("dovecot"):
            info.doveadm("expunge", "-u", username, "mailbox", "INBOX", "all", check=False)
        _delete_topics(kafka, tag)
        shutil.rmtree(claims, ignore_errors=True)
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    return figures


def _dovecot_push_off(info: DevServices, username: str) -> bool:
    """Whether Dovecot said it could not watch ``username``'s mailboxes for IDLE (inotify)."""
    if not info.imap.kind.startswith("dovecot"):
        return False
    try:
        lines = Path(info.imap.log_path).read_text(errors="replace").splitlines()
    except OSError:
        return False
    return any(DOVECOT_NO_INOTIFY in line and f"({username})" in line for line in lines)


def _check_alive(proc: subprocess.Popen[bytes], arrivals: Arrivals, work: Path) -> None:
    """A source that exited, or a consumer thread that ended, makes every later sample wait
    out its timeout: say so at once instead."""
    if proc.poll() is not None:
        raise RuntimeError(
            f"the source exited ({proc.returncode}) during the new-mail samples; "
            f"see {work / 'source.log'}"
        )
    if arrivals.failed is not None:
        raise RuntimeError(f"the bench's consumer of the events topic ended: {arrivals.failed!r}")


if __name__ == "__main__":  # pragma: no cover
    print(
        json.dumps(
            bench_ingest(
                json_out=True, mails=int(sys.argv[1]) if len(sys.argv) > 1 else 2000, rounds=1
            )
        )
    )
