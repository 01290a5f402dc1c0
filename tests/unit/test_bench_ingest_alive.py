"""``bench ingest``'s new-mail samples stop at once when what they wait on is gone (a source that
exited or a consumer thread that ended made every later sample wait out its 30 s before), and
say when Dovecot could not watch the mailbox for IDLE."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from connectors.core.config import KafkaSettings
from mailtap.bench.ingest import Arrivals, _check_alive, _dovecot_push_off


def arrivals() -> Arrivals:
    return Arrivals(KafkaSettings(bootstrap_servers="127.0.0.1:1"))


def test_a_source_that_exited_ends_the_samples_naming_its_log(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(30)
    with pytest.raises(RuntimeError, match=r"source exited \(3\).*source\.log"):
        _check_alive(proc, arrivals(), tmp_path)


def test_a_consumer_thread_that_ended_ends_the_samples_with_its_error(tmp_path: Path) -> None:
    consumer = arrivals()

    def broken() -> None:
        raise RuntimeError("Broker: Not leader for partition")

    consumer._consume = broken  # type: ignore[method-assign]
    thread = threading.Thread(target=consumer.run)
    thread.start()
    thread.join(10)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match=r"consumer of the events topic ended.*Not leader"):
            _check_alive(proc, consumer, tmp_path)
    finally:
        proc.kill()
        proc.wait(10)


def test_a_running_source_and_consumer_let_the_samples_go_on(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _check_alive(proc, arrivals(), tmp_path)  # raises when either is gone
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)


def services_logging(tmp_path: Path, text: str, kind: str = "dovecot") -> Any:
    log = tmp_path / "dovecot.log"
    log.write_text(text)
    return SimpleNamespace(imap=SimpleNamespace(kind=kind, log_path=log))


#: Dovecot 2.3's line, as logged here on 2026-12-06 while a 100-mailbox soak ran.
NO_INOTIFY = (
    "Dec 06 00:35:53 imap({user})<26494><MaWmSuxh9rN/AAAB>: Warning: Inotify instance limit "
    "for user 65534 (UID nobody) exceeded, disabling. Increase "
    "/proc/sys/fs/inotify/max_user_instances\n"
)


def test_dovecot_without_inotify_for_the_bench_user_is_reported(tmp_path: Path) -> None:
    services = services_logging(tmp_path, NO_INOTIFY.format(user="bench-1@example.com"))
    assert _dovecot_push_off(services, "bench-1@example.com")


def test_dovecot_without_inotify_for_another_user_is_not_this_bench(tmp_path: Path) -> None:
    services = services_logging(tmp_path, NO_INOTIFY.format(user="alice@example.com"))
    assert not _dovecot_push_off(services, "bench-1@example.com")
    assert not _dovecot_push_off(
        services_logging(tmp_path, NO_INOTIFY.format(user="bench-1@example.com"), kind="cyrus"),
        "bench-1@example.com",
    )
