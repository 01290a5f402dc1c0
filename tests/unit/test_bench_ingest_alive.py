"""``bench ingest``'s new-mail samples stop at once when what they wait on is gone: a source that
exited or a consumer thread that ended made every later sample wait out its 30 s before."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from connectors.core.config import KafkaSettings
from mailtap.bench.ingest import Arrivals, _check_alive


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
