"""librdkafka's lines go through Python logging, at the right level, once per condition (issue 13)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core import stopping
from connectors.core.config import KafkaSettings
from connectors.core.kafka import clients as kafka
from connectors.core.kafka.log import ClientLog

REFUSED = (
    "[thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: "
    "Connection refused (after {ms}ms in state CONNECT{suppressed})"
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "test.librdkafka"]


def test_a_repeated_condition_is_one_line_then_one_line_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    clock = Clock()
    client_log = ClientLog(logging.getLogger("test.librdkafka"), repeat_interval=60, clock=clock)
    for i in range(500):  # librdkafka's ~20 reconnects a second for 25 s
        clock.now = i * 0.05
        suppressed = f", {i} identical error(s) suppressed" if i % 7 == 3 else ""
        # confluent-kafka maps librdkafka's LOG_ERR (3) to logging.ERROR
        client_log.log(
            logging.ERROR,
            "%s [%s] %s",
            "FAIL",
            "rdkafka#producer-1",
            REFUSED.format(ms=i % 3, suppressed=suppressed),
        )
    (first,) = _records(caplog)
    # A refused connection is retried by the client: a warning, not an error.
    assert first.levelno == logging.WARNING
    assert first.getMessage().startswith("kafka FAIL [rdkafka#producer-1]: 127.0.0.1:9/bootstrap")
    assert "Connection refused" in first.getMessage() and "thrd:" not in first.getMessage()
    assert (first.facility, first.client, first.repeated) == ("FAIL", "rdkafka#producer-1", 0)  # type: ignore[attr-defined]
    clock.now = 61.0
    client_log.log(
        logging.ERROR,
        "%s [%s] %s",
        "FAIL",
        "rdkafka#consumer-2",
        REFUSED.format(ms=1, suppressed=""),
    )
    second = _records(caplog)[1]
    assert second.repeated == 499  # type: ignore[attr-defined]
    assert "and 499 more times in the last 60s" in second.getMessage()


def test_levels_follow_what_the_condition_means(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    client_log = ClientLog(logging.getLogger("test.librdkafka"))
    client_log.log(logging.WARNING, "%s [%s] %s", "COMMITFAIL", "c", "Coordinator load in progress")
    client_log.log(logging.ERROR, "%s [%s] %s", "SSL", "c", "certificate verify failed")
    client_log.client_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    client_log.client_error(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    levels = [(r.levelno, r.facility) for r in _records(caplog)]  # type: ignore[attr-defined]
    assert levels == [
        (logging.INFO, "COMMITFAIL"),
        (logging.ERROR, "SSL"),  # not a transient condition: stays an error
        (logging.WARNING, "ERROR"),
        (logging.DEBUG, "ERROR"),  # repeats the FAIL line of the same attempt
    ]


def test_flush_reports_the_repeats_not_yet_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="test.librdkafka")
    client_log = ClientLog(logging.getLogger("test.librdkafka"))
    for _ in range(4):
        client_log.log(
            logging.ERROR, "%s [%s] %s", "FAIL", "p", REFUSED.format(ms=0, suppressed="")
        )
    client_log.flush()
    assert [
        r.getMessage().endswith("(repeated 3 more times before the end)") for r in _records(caplog)
    ] == [False, True]


def test_every_client_config_routes_logs_and_errors() -> None:
    settings = KafkaSettings(bootstrap_servers="a:1")
    for conf in (
        kafka.producer_config(settings, transactional_id="t"),
        kafka.consumer_config(settings, "g"),
        kafka.client_config(settings),
    ):
        assert conf["logger"] is kafka.CLIENT_LOG
        assert conf["error_cb"] == kafka.CLIENT_LOG.client_error


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fresh_stop(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(stopping, "STOP", threading.Event())
    yield


def test_an_unreachable_cluster_is_one_sentence_and_no_raw_stderr(
    closed_port: int,
    fresh_stop: None,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.WARNING, logger="librdkafka")
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{closed_port}")
    with pytest.raises(kafka.KafkaUnavailable) as info:
        kafka.cluster_metadata(kafka.admin_client(settings), settings, timeout=3)
    assert f"cannot reach Kafka at 127.0.0.1:{closed_port} within 3s" in str(info.value)
    assert "check kafka.bootstrap_servers (or MAILTAP_KAFKA_BOOTSTRAP)" in str(info.value)
    refused = [r for r in caplog.records if r.name == "librdkafka" and "refused" in r.getMessage()]
    assert len(refused) == 1  # dozens of attempts, one line
    assert "%3|" not in capfd.readouterr().err  # nothing written around the logging system


def test_a_stop_request_ends_a_wait_for_the_cluster_at_once(
    closed_port: int, fresh_stop: None
) -> None:
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{closed_port}")
    admin = kafka.admin_client(settings)
    threading.Timer(1.0, kafka.request_stop).start()
    started = time.monotonic()
    with pytest.raises(kafka.StopRequested):
        kafka.cluster_metadata(admin, settings, timeout=60)
    print(f"stopped after {time.monotonic() - started:.2f}s of a 60s wait")


def test_a_stop_request_ends_init_transactions(closed_port: int, fresh_stop: None) -> None:
    from confluent_kafka import Producer

    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{closed_port}")
    producer = Producer(kafka.producer_config(settings, transactional_id="t-stop"))
    threading.Timer(1.0, kafka.request_stop).start()
    with pytest.raises(kafka.StopRequested):
        kafka.init_transactions(producer, settings, timeout=90)


def test_aiokafka_repeats_are_collapsed_by_the_cli_handler() -> None:
    """Under the streams worker, aiokafka logged ~50 ERROR lines a second while a broker was down."""
    from connectors.core.kafka.log import RepeatFilter

    clock = Clock()
    handler = logging.StreamHandler()
    handler.addFilter(RepeatFilter(("aiokafka",), repeat_interval=60, clock=clock))
    records: list[logging.LogRecord] = []
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("aiokafka.test")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(300):
            clock.now = i * 0.1
            logger.error(
                "Unable connect to node with id %s: [Errno 111] Connect call failed %s",
                1,
                ("127.0.0.1", 41839),
            )
        clock.now = 61.0
        logger.error(
            "Unable connect to node with id %s: [Errno 111] Connect call failed %s",
            1,
            ("127.0.0.1", 41839),
        )
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    assert [(r.levelname, r.repeated) for r in records] == [("WARNING", 0), ("WARNING", 299)]  # type: ignore[attr-defined]
    assert records[1].getMessage().endswith("(and 299 more times in the last 60s)")


class _SlowToDescribe:
    """A cluster that needs ``needs`` seconds of request time to describe itself (many topics):
    a shorter request times out, as librdkafka's list_topics does."""

    def __init__(self, needs: float) -> None:
        self.needs = needs
        self.requests: list[float] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> str:
        self.requests.append(timeout)
        if timeout < self.needs:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata"))
        return "metadata"

    def poll(self, timeout: float = 0) -> int:
        return 0


def test_a_cluster_slower_to_describe_than_one_slice_is_still_described(fresh_stop: None) -> None:
    # Before: every request was one 0.5 s slice, so a cluster that needs 1.5 s was "unreachable".
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:9")
    slow = _SlowToDescribe(needs=1.5)
    assert kafka.cluster_metadata(slow, settings, timeout=30) == "metadata"
    assert slow.requests == [0.5, 1.0, 2.0]
    assert max(slow.requests) <= kafka.MAX_METADATA_REQUEST_S  # the SIGTERM bound holds
