"""The IMAP source's start-up waits on the broker for several independent things (issue 12:
start -> first FETCH within 1.5 s): the mailboxes topic is read while the other topics are
checked and the key indexes load, not after them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from connectors.core.config import config_from_dict
from connectors.core.errors import ConfigError
from connectors.core.source import runtime as runtime_module
from connectors.core.source.ownership.wiring import MailboxesRead
from connectors.imap import source as source_module
from connectors.imap.errors import ParsePoolClosed
from connectors.imap.parsepool import ParsePool
from connectors.imap.source import ImapSource

CONFIG = {
    "kafka": {"bootstrap_servers": "k:9092"},
    "health": {"port": 0},
    "imap": {
        "accounts": [{"name": "a", "host": "imap.example.com", "username": "u", "password": "p"}],
        "parse_workers": 0,
    },
}
#: Generous: the test only fails when the two never run at the same time.
OVERLAP_WAIT_S = 20.0


def test_the_mailboxes_topic_is_read_while_the_source_prepares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reading = threading.Event()
    read = object()
    handed: dict[str, Any] = {}

    def read_mailboxes(kafka: object, source: str, configured: dict[str, Any]) -> object:
        reading.set()
        assert configured == {"a": ("INBOX",)} and source == "imap"
        return read

    def prepare(self: ImapSource, wait_for_registry: bool = True) -> None:
        # Before the fix the read began only after prepare() had returned: this waited in vain.
        handed["read_started_during_prepare"] = reading.wait(OVERLAP_WAIT_S)

    def start_sharing(*args: Any, mailboxes: MailboxesRead | None = None) -> None:
        handed["mailboxes"] = mailboxes

    monkeypatch.setattr(source_module, "read_mailboxes", read_mailboxes)
    monkeypatch.setattr(ImapSource, "prepare", prepare)
    monkeypatch.setattr(runtime_module, "start_sharing", start_sharing)
    source = ImapSource.from_config(config_from_dict(CONFIG))
    try:
        source.start()
    finally:
        source.stop()
    assert handed == {
        "read_started_during_prepare": True,
        "mailboxes": read,  # start_sharing does not read the topic a second time
    }


def test_a_failed_prepare_closes_the_mailboxes_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = threading.Event()

    class Watcher:
        def close(self) -> None:
            closed.set()

    def read_mailboxes(kafka: object, source: str, configured: object) -> MailboxesRead:
        return MailboxesRead(catalog=None, watcher=Watcher(), assignment_box=[])  # type: ignore[arg-type]

    def prepare(self: ImapSource, wait_for_registry: bool = True) -> None:
        raise RuntimeError("the registry refused the schema")

    monkeypatch.setattr(source_module, "read_mailboxes", read_mailboxes)
    monkeypatch.setattr(ImapSource, "prepare", prepare)
    source = ImapSource.from_config(config_from_dict(CONFIG))
    try:
        with pytest.raises(RuntimeError, match="refused the schema"):
            source.start()
    finally:
        source.stop()
    assert closed.is_set()


class _Sharing:
    """What start_sharing returns, without a broker: the mailboxes "started" and closed."""

    def __init__(self, seen: dict[str, Any], started: threading.Event) -> None:
        seen["sharing"] = "started"
        started.set()
        self.seen = seen

    def close(self) -> None:
        self.seen["sharing"] = "closed"


def _prepared_without_services(
    monkeypatch: pytest.MonkeyPatch, register: Any, started: threading.Event
) -> dict[str, Any]:
    """Everything prepare() and start() wait on stubbed out, except the schema registration."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(runtime_module, "check_permissions", lambda kafka, acls: [])
    monkeypatch.setattr(runtime_module, "check_created", lambda kafka, acls, topics: None)
    monkeypatch.setattr(runtime_module, "ensure_topics", lambda kafka, only=None: {})
    monkeypatch.setattr(source_module, "load_indexes", lambda kafka, serde, names: {})
    monkeypatch.setattr(source_module, "open_configured", lambda claim_check, threads: None)
    monkeypatch.setattr(
        source_module,
        "read_mailboxes",
        lambda kafka, source, configured: MailboxesRead(
            catalog=None, watcher=None, assignment_box=[]
        ),  # type: ignore[arg-type]
    )
    monkeypatch.setattr(
        runtime_module, "start_sharing", lambda *args, **kwargs: _Sharing(seen, started)
    )
    monkeypatch.setattr(source_module.AvroSerde, "prepare", register)
    return seen


def test_the_mailboxes_start_while_the_schema_registers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: registering the schema never holds the first FETCH back; start() returns once
    the registry answered."""
    mailboxes_started = threading.Event()
    started_before_registered: list[bool] = []

    def register(serde: object, topic: str) -> None:
        started_before_registered.append(mailboxes_started.wait(OVERLAP_WAIT_S))

    seen = _prepared_without_services(monkeypatch, register, mailboxes_started)
    source = ImapSource.from_config(config_from_dict(CONFIG))
    try:
        source.start()
        assert source.started.is_set()
    finally:
        source.stop()
    assert started_before_registered == [True] and seen == {"sharing": "closed"}


def test_a_registry_refusal_still_stops_start_with_its_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def register(serde: object, topic: str) -> None:
        raise ConfigError(f"the schema registry refuses the schema for {topic}-value")

    seen = _prepared_without_services(monkeypatch, register, threading.Event())
    source = ImapSource.from_config(config_from_dict(CONFIG))
    with pytest.raises(ConfigError, match=r"refuses the schema for mail\.events-value"):
        source.start()
    # Closed again by start(): the mailboxes stopped, the health endpoint too.
    assert not source.started.is_set() and source.health_port is None
    assert seen == {"sharing": "closed"}


def test_the_parse_processes_start_once_the_workers_have(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29: the parse processes used to spawn while start-up prepared, to overlap its
    waits on the broker; on 2 cores their spawn and imports (~1 s of CPU each) slowed the
    start-up's own imports and round trips instead (process start -> first event, median
    2.04 s against 1.27 s). They start once the workers have; a first batch is parsed inline."""
    warmed = threading.Event()
    order: list[str] = []

    def warm_up(pool: ParsePool) -> None:
        order.append(f"warm-up of {pool.workers}")
        warmed.set()

    def prepare(self: ImapSource, wait_for_registry: bool = True) -> None:
        order.append("prepare")

    def start_sharing(*args: object, **kwargs: object) -> None:
        order.append("workers")

    monkeypatch.setattr(ParsePool, "warm_up", warm_up)
    monkeypatch.setattr(ImapSource, "prepare", prepare)
    monkeypatch.setattr(source_module, "read_mailboxes", lambda *args: None)
    monkeypatch.setattr(runtime_module, "start_sharing", start_sharing)
    cfg = {**CONFIG, "imap": {**CONFIG["imap"], "parse_workers": 2}}  # type: ignore[dict-item]
    source = ImapSource.from_config(config_from_dict(cfg))
    try:
        source.start()
        assert warmed.wait(OVERLAP_WAIT_S)
    finally:
        source.stop()
    assert order == ["prepare", "workers", "warm-up of 2"]


def test_a_pool_closed_before_its_warm_up_starts_no_process() -> None:
    """A refused start closes the pool while the warm-up thread may not have begun: the
    warm-up must not start processes for a source that is gone."""
    pool = ParsePool(2)
    pool.close(wait=False)
    with pytest.raises(ParsePoolClosed):
        pool.warm_up()
    assert pool._executor is None  # nothing was spawned
