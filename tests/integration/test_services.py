"""The local services really answer: Kafka, Dovecot, the recording SMTP server, the registry."""

from __future__ import annotations

import json
import os
import shutil
import signal
import smtplib
import tempfile
import time
import urllib.request
from email.message import EmailMessage
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from imapclient import IMAPClient
from imapclient.exceptions import LoginError

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import load_config
from mailtap.dev import Account, DevServices, ServiceStartError, down, registry, status, up
from mailtap.dev import dovecot as dev_dovecot
from mailtap.dev.process import group_members

#: Guards against a hang, not a performance expectation: the machine is shared and slow.
DEADLINE_S = 60.0


def _consume(bootstrap: str, topic: str, want: int, **config: str) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **config,
        }
    )
    consumer.subscribe([topic])
    records: list[Message] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(records) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                continue
            records.append(msg)
    finally:
        consumer.close()
    return records


def test_kafka_produce_and_consume(services: DevServices, unique: str) -> None:
    topic = f"test.services.{unique}"
    producer = Producer({"bootstrap.servers": services.bootstrap_servers})
    producer.produce(topic, key=b"k1", value=b"hello kafka", headers=[("h", b"v")])
    assert producer.flush(DEADLINE_S) == 0

    [record] = _consume(services.bootstrap_servers, topic, 1)
    assert (record.key(), record.value()) == (b"k1", b"hello kafka")
    assert record.headers() == [("h", b"v")]


def test_kafka_transactions_work_on_one_node(services: DevServices, unique: str) -> None:
    """Needs transaction.state.log replication factor 1 / min ISR 1 on the single broker."""
    topic = f"test.txn.{unique}"
    producer = Producer(
        {"bootstrap.servers": services.bootstrap_servers, "transactional.id": f"tx-{unique}"}
    )
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    producer.produce(topic, key=b"a", value=b"aborted")
    producer.abort_transaction(DEADLINE_S)
    producer.begin_transaction()
    producer.produce(topic, key=b"c", value=b"committed")
    producer.commit_transaction(DEADLINE_S)

    records = _consume(
        services.bootstrap_servers, topic, 1, **{"isolation.level": "read_committed"}
    )
    assert [r.value() for r in records] == [b"committed"]


def _mail(subject: str, body: str = "hello") -> bytes:
    msg = EmailMessage()
    msg["From"] = "sender@example.org"
    msg["To"] = "alice@example.com"
    msg["Subject"] = subject
    msg["Message-ID"] = f"<{subject}@example.org>"
    msg.set_content(body)
    return msg.as_bytes()


def test_dovecot_login_append_fetch_with_condstore(
    services: DevServices, imap_account: Account, unique: str
) -> None:
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
        client.login(imap_account.username, imap_account.password)
        assert b"CONDSTORE" in client.capabilities()
        assert b"QRESYNC" in client.capabilities()
        assert b"IDLE" in client.capabilities()
        client.enable("CONDSTORE", "QRESYNC")
        raw = _mail(f"append-{unique}")
        client.append("INBOX", raw, flags=[b"\\Flagged"])
        selected = client.select_folder("INBOX")
        assert selected[b"EXISTS"] == 1
        assert selected[b"HIGHESTMODSEQ"] > 0
        [uid] = client.search(["ALL"])
        fetched = client.fetch([uid], ["BODY.PEEK[]", "FLAGS", "MODSEQ"])[uid]
        assert fetched[b"BODY[]"].replace(b"\r\n", b"\n") == raw.replace(b"\r\n", b"\n")
        assert b"\\Flagged" in fetched[b"FLAGS"]
        assert fetched[b"MODSEQ"][0] > 0


def test_doveadm_changes_uidvalidity_and_expunges(
    services: DevServices, imap_account: Account, unique: str
) -> None:
    user = imap_account.username
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
        client.login(user, imap_account.password)
        client.append("INBOX", _mail(f"doveadm-{unique}"))
        before = client.select_folder("INBOX")[b"UIDVALIDITY"]

    services.doveadm("mailbox", "update", "-u", user, "--uid-validity", str(before + 7), "INBOX")
    services.doveadm("expunge", "-u", user, "mailbox", "INBOX", "all")

    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
        client.login(user, imap_account.password)
        after = client.select_folder("INBOX")
        assert after[b"UIDVALIDITY"] == before + 7
        assert after[b"EXISTS"] == 0


def test_added_user_logs_in_and_unknown_password_is_refused(
    services: DevServices, unique: str
) -> None:
    account = services.add_user(f"late-{unique}@example.com", "s3cret")
    with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
        client.login(account.username, account.password)
    with (
        IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client,
        pytest.raises(LoginError, match="AUTHENTICATIONFAILED"),
    ):
        client.login(account.username, "wrong")


def test_smtp_server_keeps_what_it_received(services: DevServices, unique: str) -> None:
    msg = EmailMessage()
    msg["From"] = "mailtap@example.com"
    msg["To"] = "customer@example.net"
    msg["Subject"] = f"reply {unique}"
    msg.set_content("Thanks, we are on it.")
    with smtplib.SMTP(services.smtp.host, services.smtp.port, timeout=30) as client:
        refused = client.send_message(
            msg, from_addr="bounce+x@example.com", to_addrs=["customer@example.net", "cc@x.org"]
        )
    assert refused == {}

    mine = [m for m in services.received_messages() if m.message["Subject"] == f"reply {unique}"]
    assert len(mine) == 1
    got = mine[0]
    assert got.mail_from == "bounce+x@example.com"
    assert got.rcpt_tos == ("customer@example.net", "cc@x.org")
    assert got.message.get_content().strip() == "Thanks, we are on it."
    assert got.path.read_bytes() == got.raw


def test_written_config_points_at_the_services(services: DevServices) -> None:
    config = yaml.safe_load(services.config_path.read_text())
    assert config["kafka"]["bootstrap_servers"] == services.bootstrap_servers
    [account] = config["imap"]["accounts"]
    assert (account["host"], account["port"]) == (services.imap.host, services.imap.port)
    assert (account["username"], account["password"]) == ("demo@example.com", "secret")
    assert (config["smtp"]["host"], config["smtp"]["port"]) == (
        services.smtp.host,
        services.smtp.port,
    )
    assert config["claim_check"]["url"] == services.claims_dir.as_uri()
    with IMAPClient(account["host"], account["port"], ssl=False, timeout=30) as client:
        client.login(account["username"], account["password"])


def test_up_is_idempotent_and_down_leaves_no_process(tmp_path: Path) -> None:
    """A second, independent set in its own state dir: started, re-`up`ed, stopped."""
    # pytest's tmp_path sits in a 0700 folder: Dovecot's files then go to /var/tmp (see
    # mailtap.dev.dovecot.dovecot_root), which this also exercises.
    state_dir = tmp_path / "second-set"
    info = up(state_dir)
    try:
        # Its new broker made its coordinators already (issue 29: the first source started on
        # it waited ~4 s for them inside its first init_transactions).
        internal = AdminClient({"bootstrap.servers": info.bootstrap_servers}).list_topics(
            timeout=30
        )
        assert {"__transaction_state", "__consumer_offsets"} <= set(internal.topics)
        groups = {pid: group_members(pid) for pid in info.pids}
        assert all(groups.values()), groups  # every service is running
        assert len(groups[info.imap.pid]) > 1  # Dovecot's master forked its helpers

        again = up(state_dir)
        assert again.pids == info.pids  # no new processes
        assert status(state_dir) == info

        # A second Dovecot on the same base_dir would fail while the first keeps answering;
        # start-up refuses it up front, naming the pid to stop.
        layout = dev_dovecot.DovecotLayout(info.imap.config_path.parent)
        master = dev_dovecot.leftover_master(layout)
        # The master leads the group `up` recorded, or (in a test session, under
        # process.spawn's group guard) is in it.
        assert master is not None and os.getpgid(master) == info.imap.pid
        with pytest.raises(ServiceStartError, match=rf"\(pid {master}\)"):
            dev_dovecot.start(layout)
    finally:
        stopped = down(state_dir)

    assert sorted(stopped) == sorted(info.pids)
    assert {pid: group_members(pid) for pid in info.pids} == {pid: [] for pid in info.pids}
    assert status(state_dir) is None
    assert down(state_dir) == []
    shutil.rmtree(info.imap.config_path.parent.parent, ignore_errors=True)


def test_external_kafka_is_used_and_a_half_dead_set_is_restarted(
    services: DevServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAILTAP_KAFKA_BOOTSTRAP", services.bootstrap_servers)
    monkeypatch.setenv("MAILTAP_DEV_REGISTRY", "off")
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-test-external-"))
    state_dir.chmod(0o755)
    try:
        info = up(state_dir)
        assert info.kafka.external and info.kafka.pid is None
        assert info.kafka.bootstrap_servers == services.bootstrap_servers
        assert len(info.pids) == 2  # Dovecot and SMTP only
        config = yaml.safe_load(info.config_path.read_text())
        assert config["kafka"] == {"bootstrap_servers": services.bootstrap_servers}

        os.kill(info.smtp.pid, signal.SIGKILL)  # a crash: state file still lists it
        deadline = time.monotonic() + DEADLINE_S
        while group_members(info.smtp.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(state_dir) is None

        again = up(state_dir)
        assert status(state_dir) == again
        assert again.smtp.pid != info.smtp.pid
        assert group_members(info.imap.pid) == []  # the old Dovecot was stopped, not leaked
        assert down(state_dir) == again.pids
    finally:
        down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
    if services.kafka.pid is not None:
        assert group_members(services.kafka.pid) != []  # the shared Kafka was left alone


def _subject(url: str, subject: str) -> tuple[int, str]:
    """(schema id of the latest version, compatibility) of ``subject``."""
    with urllib.request.urlopen(f"{url}/subjects/{subject}/versions/latest", timeout=30) as r:
        schema_id = json.load(r)["id"]
    with urllib.request.urlopen(f"{url}/config/{subject}", timeout=30) as r:
        return schema_id, json.load(r)["compatibilityLevel"]


@pytest.mark.skipif(not registry.is_installed(), reason="registry not built: `make registry`")
def test_the_registry_keeps_its_schema_ids_across_a_restart(
    services: DevServices, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` starts the registry and names it in the config; a registry killed right after it
    answered a registration, restarted by the next `up`, hands out the same ids (Kafka's records
    keep the ids they were written with). Before: in-memory storage, every subject gone."""
    monkeypatch.setenv("MAILTAP_KAFKA_BOOTSTRAP", services.bootstrap_servers)  # a faster set
    monkeypatch.delenv("MAILTAP_DEV_REGISTRY", raising=False)
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-test-registry-"))
    state_dir.chmod(0o755)
    try:
        info = up(state_dir)
        assert info.registry is not None and info.registry.pid in info.pids
        kafka = load_config(info.config_path).kafka
        assert kafka.schema_registry_url == info.registry.url
        topic = f"mail.events.{unique}"
        AvroSerde.for_schema("MailEvent", kafka).prepare(topic)
        before = _subject(info.registry.url, f"{topic}-value")
        assert before[1] == "FULL_TRANSITIVE"

        os.killpg(info.registry.pid, signal.SIGKILL)  # no orderly shutdown, no flush
        deadline = time.monotonic() + DEADLINE_S
        while group_members(info.registry.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(state_dir) is None

        again = up(state_dir)
        assert again.registry is not None and again.registry.pid != info.registry.pid
        assert _subject(again.registry.url, f"{topic}-value") == before
        kafka = load_config(again.config_path).kafka
        assert kafka.schema_registry_url == again.registry.url
        # A schema registered after the restart gets an id of its own, not a reused one.
        AvroSerde.for_schema("DeliveryEvent", kafka).prepare(f"mail.delivery.{unique}")
        new_id, _ = _subject(again.registry.url, f"mail.delivery.{unique}-value")
        assert new_id != before[0]
        assert sorted(down(state_dir)) == sorted(again.pids)
        assert group_members(again.registry.pid) == []
    finally:
        down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
