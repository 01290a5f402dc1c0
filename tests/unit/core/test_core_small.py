import random
import ssl

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from connectors.core.config import KafkaSettings
from connectors.core.errors import (
    AuthenticationError,
    ConfigError,
    DataError,
    Disposition,
    classify,
)
from connectors.core.kafka import transactions
from connectors.core.kafka.clients import client_config, producer_config
from connectors.core.kafka.errors import FencedError, TransactionAborted
from connectors.core.kafka.offsets import canonical_json
from connectors.core.kafka.topics import topic_specs
from connectors.core.kafka.transactions import transactional_id
from connectors.core.source.backoff import Backoff


def test_backoff_grows_to_the_cap_with_jitter_and_resets() -> None:
    b = Backoff(initial=1.0, cap=8.0, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(10)]
    assert all(0 <= d <= 8.0 for d in delays)
    assert max(delays[5:]) > 1.0  # grows past the initial delay
    assert b.at_cap() == 8.0
    b.reset()
    assert b.attempt == 0 and b.next_delay() <= 1.0


def test_classify_case_by_case() -> None:
    assert classify(ConfigError("x")) is Disposition.PERMANENT
    assert classify(AuthenticationError("x")) is Disposition.PERMANENT
    assert classify(ssl.SSLCertVerificationError("bad cert")) is Disposition.PERMANENT
    assert classify(DataError("x")) is Disposition.DATA
    assert classify(TimeoutError("t")) is Disposition.RETRY
    assert classify(ConnectionResetError()) is Disposition.RETRY
    try:
        try:
            raise AuthenticationError("nope")
        except AuthenticationError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert classify(outer) is Disposition.PERMANENT


def test_canonical_json_is_order_independent() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == canonical_json({"a": "é", "b": 1})


def test_transactional_id_is_stable_and_distinct() -> None:
    a = transactional_id("mailtap-imap", {"account": "a", "folder": "INBOX"})
    assert a == transactional_id("mailtap-imap", {"folder": "INBOX", "account": "a"})
    assert a != transactional_id("mailtap-imap", {"account": "a", "folder": "Archive"})
    assert len(transactional_id("p", {"account": "x" * 500, "folder": "y"})) < 200


def test_producer_config_is_idempotent_and_transactional() -> None:
    conf = producer_config(KafkaSettings(bootstrap_servers="a:1"), transactional_id="t")
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["transactional.id"] == "t"


def test_ssl_always_verifies() -> None:
    conf = producer_config(
        KafkaSettings(
            bootstrap_servers="a:1",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="u",
            sasl_password="p",
        )
    )
    assert conf["enable.ssl.certificate.verification"] is True


def test_topic_specs_compact_where_design_says() -> None:
    specs = {
        s.name: s.config["cleanup.policy"]
        for s in topic_specs(KafkaSettings(bootstrap_servers="a:1"), ["5m"])
    }
    assert specs["mail.events"] == "compact"
    assert specs["mail.delivery"] == "compact"
    assert specs["mailtap.offsets"] == "compact"
    assert specs["mail.suppressions"] == "compact"
    assert specs["mail.commands"] == "delete"
    assert specs["mail.commands.retry.5m"] == "delete"


def test_clients_skip_the_metrics_push_unless_the_properties_ask_for_it() -> None:
    # A source holds a producer per mailbox; the push's histograms cost ~190 KB each.
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    conf = producer_config(settings, transactional_id="t")
    assert conf["enable.metrics.push"] is False
    Producer(conf)  # librdkafka knows the property: an unknown one raises here
    wanted = KafkaSettings(
        bootstrap_servers="127.0.0.1:1", client_properties={"enable.metrics.push": "true"}
    )
    assert client_config(wanted)["enable.metrics.push"] == "true"


def test_a_transactional_writer_connects_to_every_broker_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 29: with librdkafka's sparse connections, init_transactions of a producer created
    # a moment ago waited a fixed 500 ms for the coordinator's connection in most starts.
    made: list[dict[str, object]] = []

    def producer(conf: dict[str, object]) -> Producer:
        made.append(conf)
        return Producer(conf)  # librdkafka knows the property: an unknown one raises here

    monkeypatch.setattr(transactions, "Producer", producer)
    monkeypatch.setattr(transactions, "init_transactions", lambda *args: None)
    writer = transactions.TransactionalSourceWriter(
        KafkaSettings(bootstrap_servers="127.0.0.1:1"), "mailtap-imap-a-INBOX"
    )
    writer.close()
    assert [c["enable.sparse.connections"] for c in made] == [False]
    assert made[0]["transactional.id"] == "mailtap-imap-a-INBOX"


def test_only_transactional_producers_connect_to_every_broker_at_once() -> None:
    # Every transactional producer of mailtap (source writers, the sink's lanes, the bounce
    # reader) gets it from producer_config; a plain producer keeps librdkafka's default.
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    assert producer_config(kafka, transactional_id="t")["enable.sparse.connections"] is False
    assert "enable.sparse.connections" not in producer_config(kafka)
    # An operator's own client_properties setting wins.
    own = KafkaSettings(
        bootstrap_servers="127.0.0.1:1", client_properties={"enable.sparse.connections": "true"}
    )
    assert producer_config(own, transactional_id="t")["enable.sparse.connections"] == "true"


class FencedProducer:
    """A transactional producer the broker fenced while a transaction was open, as librdkafka
    reports it: ``produce()`` raises only "Local: Fatal error" (the error's ``fatal()`` flag
    unset), and the abort then says ``_FENCED``."""

    produce_code = KafkaError._FATAL
    abort_code: int | None = KafkaError._FENCED

    def __init__(self, conf: dict[str, object]) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args: object, **kwargs: object) -> None:
        raise KafkaException(KafkaError(self.produce_code, "Unable to produce message"))

    def abort_transaction(self, timeout: float) -> None:
        if self.abort_code is not None:
            raise KafkaException(KafkaError(self.abort_code, "fenced by a newer instance"))


@pytest.mark.parametrize(
    ("produce_code", "abort_code"),
    [
        (KafkaError._FATAL, KafkaError._FENCED),  # as CI saw it
        (KafkaError._FATAL, None),  # the produce's error alone says it
        (KafkaError._STATE, KafkaError._FENCED),  # the abort alone says it
    ],
)
def test_a_writer_fenced_mid_transaction_stops_not_retries(
    monkeypatch: pytest.MonkeyPatch, produce_code: int, abort_code: int | None
) -> None:
    # Found by CI (test_imap_faults, a second instance started mid-backfill): the fenced first
    # instance took "Local: Fatal error" for an aborted transaction, backed off and idled on.
    monkeypatch.setattr(transactions, "Producer", FencedProducer)
    monkeypatch.setattr(transactions, "init_transactions", lambda *args: None)
    monkeypatch.setattr(FencedProducer, "produce_code", produce_code)
    monkeypatch.setattr(FencedProducer, "abort_code", abort_code)
    writer = transactions.TransactionalSourceWriter(
        KafkaSettings(bootstrap_servers="127.0.0.1:1"), "mailtap-imap-a-INBOX"
    )
    record = transactions.SourceRecord("mail.events", b"k", b"v")
    with pytest.raises(FencedError):
        writer.write([record], [({"account": "a"}, {"uid": 1})])


def test_a_writer_whose_transaction_failed_otherwise_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactions, "Producer", FencedProducer)
    monkeypatch.setattr(transactions, "init_transactions", lambda *args: None)
    monkeypatch.setattr(FencedProducer, "produce_code", KafkaError._STATE)
    monkeypatch.setattr(FencedProducer, "abort_code", None)
    writer = transactions.TransactionalSourceWriter(
        KafkaSettings(bootstrap_servers="127.0.0.1:1"), "mailtap-imap-a-INBOX"
    )
    with pytest.raises(TransactionAborted):
        writer.write([transactions.SourceRecord("mail.events", b"k", b"v")], [])
