"""``mailtap bench startup``: IMAP source start-up with a large ``mail.events`` of other accounts.

Issue 12: the time from process start to the first FETCH must not grow with the events of the
accounts an instance does not own (target: <= 1.5 s with 1,000,000 of them). One run:

1. puts ``--other-events`` events of ``--other-accounts`` other accounts on ``mail.events`` (a
   plain producer; each a real encoded MailEvent of ~240 bytes) and their key index changelog
   records on ``mailtap.imap-index``, as their own sources would have written them;
2. starts the real ``mailtap run imap-source`` for one account of its own with a few new mails,
   and times spawn -> the source's ``N mails to read`` line (logged just before its first
   FETCH): a first start (new account), then ``--rounds`` restarts from the changelog and as
   many with ``MAILTAP_IMAP_INDEX_REBUILD=1`` (the path before the changelog: the key index
   rebuilt from the whole of ``mail.events``), alternating, each after a few new mails;
3. prints the medians, their ratio, and what each index load read (from its log line).

mailtap's own modules are compiled to bytecode first (``__pycache__``, git-ignored), as
``pip install`` does for the image: a checkout run with PYTHONDONTWRITEBYTECODE=1 (the image's
setting, and this machine's) would otherwise compile every module at every start, 0.1-0.2 s of
the start-up that a deployed source does not pay.

Figures, not assertions. The round's topics are deleted at the end.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from imapclient import IMAPClient

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.offsets import OffsetStore
from connectors.core.kafka.topics import ensure_topics
from connectors.core.mail import parse_mail
from connectors.core.source.location import SourceLocation
from connectors.imap.index import ENV_REBUILD
from connectors.imap.indexlog import IndexChangelog, marker_key, partition_of
from mailtap.bench.bytecode import compile_ahead
from mailtap.bench.ingest import _backfill_started, _delete_topics, _say, _services
from mailtap.dev import DevServices
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.process import terminate

#: The issue's target, process start -> first FETCH.
TARGET_S = 1.5
#: New mails per start: more than the batch size (1), so the source logs "mails to read".
MAILS_PER_START = 3
#: A start that has not fetched within this long is reported, not waited for forever.
START_TIMEOUT_S = 600.0

_LOAD_LINE = re.compile(
    r"imap index: (\d+) records read from \S+ \(partitions ([\d,]*); (\d+) of these accounts\), "
    r"(\d+) of \S+ for a rebuild, in ([\d.]+)s"
)


def bench_startup(
    json_out: bool, other_events: int, other_accounts: int, rounds: int
) -> dict[str, Any]:
    info = _services()
    tag = uuid.uuid4().hex[:8]
    names = {f: f"{getattr(TopicNames(), f)}.bench-{tag}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(bootstrap_servers=info.bootstrap_servers, topics=TopicNames(**names))
    ensure_topics(kafka, retry_tiers=["1m"])
    account = f"startup-{tag}"
    username, password = f"bench-startup-{tag}@example.com", "bench"
    info.add_user(username, password)
    work = Path(tempfile.mkdtemp(prefix="mailtap-bench-startup-"))
    changelog = IndexChangelog.open(kafka)
    figures: dict[str, Any] = {
        "other_events": other_events,
        "other_accounts": other_accounts,
        "changelog_partitions": changelog.partitions,
        "own_partition": partition_of(account, changelog.partitions),
        "target_seconds": TARGET_S,
    }
    try:
        _say(f"producing {other_events} events of {other_accounts} other accounts ...")
        started = time.monotonic()
        _fill(kafka, changelog, tag, other_events, other_accounts)
        figures["produce_seconds"] = round(time.monotonic() - started, 1)
        config = work / "mailtap.yaml"
        config.write_text(yaml.safe_dump(_config(info, kafka, account, username, password, work)))
        appended = 0

        def start(label: str, rebuild: bool) -> dict[str, Any]:
            nonlocal appended
            _append(info, username, password, tag, appended, MAILS_PER_START)
            appended += MAILS_PER_START
            _say(f"{label}: starting the source ...")
            return _timed_start(kafka, account, config, work / f"{label}.log", appended, rebuild)

        figures["bytecode_compiled_ahead"] = compile_ahead()
        figures["interpreter_and_imports_s_median"] = _imports_floor(rounds)
        figures["first_start"] = start("first-start", rebuild=False)
        changelog_runs, scan_runs = [], []
        for n in range(rounds):
            changelog_runs.append(start(f"changelog-{n}", rebuild=False))
            scan_runs.append(start(f"full-scan-{n}", rebuild=True))
        figures["restart_changelog"] = changelog_runs
        figures["restart_full_scan"] = scan_runs
        fast = statistics.median(r["start_to_first_fetch_s"] for r in changelog_runs)
        slow = statistics.median(r["start_to_first_fetch_s"] for r in scan_runs)
        figures["changelog_start_to_first_fetch_s_median"] = round(fast, 2)
        figures["full_scan_start_to_first_fetch_s_median"] = round(slow, 2)
        figures["full_scan_to_changelog_ratio"] = round(slow / fast, 1)
        figures["changelog_meets_target"] = fast <= TARGET_S
        if not json_out:
            for key, value in figures.items():
                _say(f"{key}: {value}")
    finally:
        info.doveadm("expunge", "-u", username, "mailbox", "INBOX", "all", check=False)
        _delete_topics(kafka, tag)
        shutil.rmtree(work, ignore_errors=True)
    return figures


def _imports_floor(rounds: int) -> float:
    """Spawn -> exit of an interpreter that only imports what ``mailtap run imap-source``
    imports: the part of the start-up no index design changes, on this machine, now."""
    code = "import mailtap.cli, connectors.imap.source"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    times = []
    for _ in range(rounds):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT, env=env)
        times.append(time.monotonic() - started)
    return round(statistics.median(times), 3)


def _fill(
    kafka: KafkaSettings, changelog: IndexChangelog, tag: str, events: int, accounts: int
) -> None:
    """Other accounts' events and their changelog records, as their sources would write them."""
    serde = AvroSerde.for_schema("MailEvent", kafka)
    source = {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": 1, "modseq": None,
              "item_id": None, "change_key": None}  # fmt: skip
    mail = (
        b"Message-ID: <other@example.com>\r\nFrom: a@example.com\r\nTo: b@example.com\r\n"
        b"Subject: another account's mail\r\nDate: Sun, 29 Nov 2026 12:00:00 +0000\r\n\r\nhi\r\n"
    )
    parsed = parse_mail(
        mail,
        account="other",
        source=source,
        flags=[],
        internal_date=None,
        observed_at=dt.datetime.now(dt.UTC),
    )
    value = serde.encode(dict(parsed.event), kafka.topics.events)
    location = b'{"fingerprint":null,"folder":"INBOX","uid":1,"uidvalidity":1}'
    producer = Producer(producer_config(kafka, linger_ms=100, batch_num_messages=10000))

    def produce(topic: str, key: bytes, data: bytes, partition: int = -1) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=data, partition=partition)
                return
            except BufferError:
                producer.poll(0.1)

    where = [partition_of(f"other{n}-{tag}", changelog.partitions) for n in range(accounts)]
    for i in range(events):
        n = i % accounts
        key = f"other{n}-{tag}/mid:{i}@example.com".encode()
        produce(kafka.topics.events, key, value)
        # Keyed by (key, folder) as the source writes it (indexlog.location_key).
        record = changelog.partition_for(f"other{n}-{tag}").location(
            key.decode(), "INBOX", 1, 1, None
        )
        produce(changelog.topic, record.key, location, where[n])
    for n in range(accounts):
        produce(changelog.topic, marker_key(f"other{n}-{tag}").encode(), b"{}", where[n])
    if producer.flush(300) > 0:
        raise RuntimeError("the other accounts' records were not all written within 300 s")


def _config(
    info: DevServices,
    kafka: KafkaSettings,
    account: str,
    username: str,
    password: str,
    work: Path,
) -> dict[str, Any]:
    return {
        "kafka": kafka.model_dump(mode="json", exclude_none=True),
        "claim_check": {"url": (work / "claims").as_uri()},
        "health": {"port": 0},
        "imap": {
            "accounts": [
                {
                    "name": account,
                    "host": info.imap.host,
                    "port": info.imap.port,
                    "security": "plain",
                    "username": username,
                    "password": password,
                    "folders": ["INBOX"],
                    "start": "all",
                }
            ],
            # One mail per FETCH: a start with MAILS_PER_START new mails logs "mails to read".
            "batch_size": 1,
        },
    }


def _append(
    info: DevServices, username: str, password: str, tag: str, first: int, count: int
) -> None:
    client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
    client.login(username, password)
    for i in range(first, first + count):
        client.append(
            "INBOX",
            f"Message-ID: <startup-{i}-{tag}@example.com>\r\nFrom: a@example.com\r\n"
            f"Subject: start-up {i}\r\n\r\nhello\r\n".encode(),
        )
    client.logout()


def _timed_start(
    kafka: KafkaSettings, account: str, config: Path, log_path: Path, mails: int, rebuild: bool
) -> dict[str, Any]:
    """Spawn the source, time spawn -> its "mails to read" line, let it commit ``mails``
    (so the next start has a cursor), stop it; what its index load read, from its log."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop(ENV_REBUILD, None)
    if rebuild:
        env[ENV_REBUILD] = "1"
    command = [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", str(config)]
    with open(log_path, "wb") as log_file:
        spawned = time.time()
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env
        )
        try:
            fetched = None
            deadline = time.monotonic() + START_TIMEOUT_S
            while fetched is None:
                if proc.poll() is not None:
                    raise RuntimeError(f"the source exited early:\n{_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"no FETCH within {START_TIMEOUT_S:.0f}s:\n{_tail(log_path)}"
                    )
                time.sleep(0.05)
                fetched = _backfill_started(log_path)
            key = SourceLocation("imap", account, "INBOX").partition_key
            while (OffsetStore(kafka).read_all().get(key) or {}).get("last_uid", 0) < mails:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the mails were not committed:\n{_tail(log_path)}")
                time.sleep(0.2)
        finally:
            terminate(proc)
    run: dict[str, Any] = {"start_to_first_fetch_s": round(fetched - spawned, 3)}
    lines = log_path.read_text(errors="replace").splitlines()
    for line in lines:
        load = _LOAD_LINE.search(line)
        loaded = _stamp(line) if load is not None else None
        if load is None or loaded is None:
            continue
        run["changelog_records_read"] = int(load.group(1))
        run["changelog_records_of_account"] = int(load.group(3))
        run["events_scanned"] = int(load.group(4))
        run["index_load_s"] = float(load.group(5))
        # Where the rest of the time goes: before the load (interpreter, imports, topics
        # check, registry) and after it (transactional producer, IMAP login, SELECT, cursor).
        run["before_index_load_s"] = round(loaded - run["index_load_s"] - spawned, 3)
        run["after_index_load_s"] = round(fetched - loaded, 3)
    return run


def _stamp(line: str) -> float | None:
    """Epoch seconds of a log line's ``%Y-%m-%d %H:%M:%S,mmm`` (local time) prefix."""
    try:
        stamp, millis = line[:23].split(",")
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1e3
    except ValueError:
        return None


def _tail(log_path: Path, lines: int = 30) -> str:
    """The end of a source's log, for the error (the work folder is deleted afterwards)."""
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
