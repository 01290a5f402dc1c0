"""The watchdog on librdkafka calls that ignore their timeout (connectors/core/kafka/watchdog.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from connectors.core.kafka import watchdog


def test_a_call_that_returns_in_time_gives_its_value_and_its_errors() -> None:
    assert watchdog.bounded(lambda: 42, 5.0, "a quick call") == 42
    with pytest.raises(ValueError, match="refused"):
        watchdog.bounded(lambda: (_ for _ in ()).throw(ValueError("refused")), 5.0, "a call")


def test_a_call_blocked_past_its_timeout_ends_the_process_with_one_sentence() -> None:
    # As librdkafka's send_offsets_to_transaction after a broker restart (#5456, #5511): the
    # call never returns; the process logs why and exits 75 instead of hanging while healthy.
    program = textwrap.dedent(
        """
        import logging, threading
        from connectors.core.kafka import watchdog
        logging.basicConfig(level=logging.INFO)
        watchdog.GRACE_S = 0.2
        watchdog.bounded(threading.Event().wait, 0.3, "send_offsets_to_transaction (test)")
        print("returned")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == watchdog.EXIT_KAFKA_HUNG, done.stderr
    assert "returned" not in done.stdout
    lines = [line for line in done.stderr.splitlines() if "did not return" in line]
    assert len(lines) == 1 and "send_offsets_to_transaction (test)" in lines[0], done.stderr
