"""The pieces both sources share: start position, DLQ/event records, crash points, backoff."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from connectors.core import checkpoints
from connectors.core.errors import AuthenticationError, ConfigError
from connectors.core.kafka.errors import TransactionAborted
from connectors.core.metrics import SourceMetrics
from connectors.core.source.backoff import Backoff
from connectors.core.source.reconnect import backoff_delay
from connectors.core.source.records import MailEventRecords
from connectors.core.source.settings import check_section, start_since, validate_start
from tests.support.crashpoints import EXIT_CODE, CrashPoints, crash_env

pytestmark = pytest.mark.unit

LABELS = ("imap", "acct", "INBOX")
REPO = Path(__file__).resolve().parents[3]


class ConnectionLost(ConnectionError):
    pass


# --- start position -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["all", "latest", "since:2026-01-31", "since: 2026-01-31"])
def test_valid_starts_are_kept(value: str) -> None:
    assert validate_start(value) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [("since:31.01.2026", "ISO date"), ("newest", "expected all, latest"), ("", "expected")],
)
def test_invalid_starts_say_what_to_write(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_start(value)


@pytest.mark.parametrize(
    ("names", "initial", "cap", "message"),
    [
        ([], 1.0, 2.0, "list at least one account under imap.accounts"),
        (["a", "a"], 1.0, 2.0, "account names must be unique"),
        (["a"], 5.0, 2.0, "backoff_cap_seconds must be >= backoff_initial_seconds"),
    ],
)
def test_section_rules(names: list[str], initial: float, cap: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_section(names, initial, cap, accounts_key="imap.accounts")
    check_section(["a", "b"], 1.0, 1.0, accounts_key="imap.accounts")


def test_start_since_reads_the_day() -> None:
    assert start_since("since: 2026-02-03") == dt.date(2026, 2, 3)
    assert start_since("all") is None


# --- records ---------------------------------------------------------------------------------


class JsonSerde:
    def encode(self, value: dict[str, Any], topic: str) -> bytes:
        return json.dumps(value, sort_keys=True).encode()


def _records(max_record_bytes: int = 10_000) -> MailEventRecords:
    return MailEventRecords(
        source_kind="EWS",
        account="ops",
        folder="inbox",
        serde=JsonSerde(),  # type: ignore[arg-type]
        events_topic="ev",
        dlq_topic="dlq",
        max_record_bytes=max_record_bytes,
    )


def test_a_flagged_event_is_published_and_reported_with_the_source_s_headers() -> None:
    event = {"parse_error": "bad", "raw_ref": {"uri": "file:///b/raw/ab/abc"}}
    records = _records().event_records(
        "ops/mid:1", event, b"{}", b"raw mime", [("mailtap.source.item_id", b"AAMk")]
    )
    assert [(r.topic, r.key, r.value) for r in records] == [
        ("ev", b"ops/mid:1", b"{}"),
        ("dlq", b"ops/mid:1", b"raw mime"),
    ]
    names = [name for name, _ in records[1].headers]
    assert names == [
        "mailtap.error.kind",
        "mailtap.error.message",
        "mailtap.source.kind",
        "mailtap.source.account",
        "mailtap.source.folder",
        "mailtap.source.item_id",
        "mailtap.raw.sha256",
        "mailtap.raw.size",
        "mailtap.raw.uri",
    ]
    assert dict(records[1].headers)["mailtap.source.kind"] == b"EWS"


def test_the_event_carries_its_conversation_in_a_header() -> None:
    """What the streams worker re-keys it by without decoding it (issue 29)."""
    reply = {
        "key": "ops/mid:b@x",
        "message_id": "b@x",
        "in_reply_to": "a2@x",
        "references": ["<Root@X>", "a2@x"],
        "parse_error": None,
    }
    (record,) = _records().event_records("ops/mid:b@x", reply, b"v", b"raw", [])
    assert record.headers == (("mailtap.conversation", b"root@x"),)
    new = {"key": "ops/mid:n@x", "message_id": "N@X", "references": [], "parse_error": None}
    (record,) = _records().event_records("ops/mid:n@x", new, b"v", b"raw", [])
    assert dict(record.headers)["mailtap.conversation"] == b"n@x"


def test_a_clean_event_is_one_record_and_a_big_raw_is_left_out_of_the_dlq() -> None:
    records = _records()
    assert len(records.event_records("k", {"parse_error": None}, b"v", b"raw", [])) == 1
    dlq = _records(max_record_bytes=1100).dlq("k", b"x" * 2000, "unparseable", "bug", None, [])
    assert dlq.value == b"" and dict(dlq.headers)["mailtap.raw.size"] == b"2000"


def test_an_event_over_the_cap_sheds_its_bodies_then_fails() -> None:
    event = {"text_body": "x" * 5000, "html_body": None, "attachments": [{}] * 150}
    slim = json.loads(_records(max_record_bytes=2000).encode(event))
    assert slim["text_body"] is None and slim["body_truncated"] is True
    assert len(slim["attachments"]) == 100
    with pytest.raises(ValueError, match="record cap"):
        _records(max_record_bytes=10).encode(event)


def test_a_tombstone_has_no_value() -> None:
    assert _records().tombstone("k").value is None


# --- crash points ----------------------------------------------------------------------------


def test_crash_points_parse_their_spec() -> None:
    assert CrashPoints("in_transaction:3").point == "in_transaction"
    assert CrashPoints("before_write").active
    assert not CrashPoints(None).active and CrashPoints("").point is None


def _reach(points: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A process that passes ``points`` (one checkpoint per line of code) in the product's module."""
    code = "from connectors.core import checkpoints\n" + "".join(
        f"checkpoints.reached({point!r}); print({point!r}, flush=True)\n"
        for point in points.split()
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_process_exits_137_the_nth_time_a_point_is_reached() -> None:
    done = _reach("other before_write before_write never", crash_env("before_write:2"))
    assert done.returncode == EXIT_CODE
    assert done.stdout == "other\nbefore_write\n"
    assert "crashing at before_write:2" in done.stderr


def test_without_an_observer_the_checkpoints_do_nothing() -> None:
    # The crash spec alone is not enough: the product loads no test module unless told to.
    done = _reach("before_write in_transaction", {"MAILTAP_TEST_CRASH_AT": "before_write:1"})
    assert (done.returncode, done.stdout) == (0, "before_write\nin_transaction\n")


def test_an_observer_module_that_does_not_exist_stops_with_a_sentence() -> None:
    done = _reach("before_write", {checkpoints.ENV: "tests.support.no_such_module"})
    assert done.returncode == 1
    assert "names no importable module" in done.stderr and ConfigError.__name__ in done.stderr


# --- backoff decision ------------------------------------------------------------------------


def _count(metrics: SourceMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(f"mailtap_{name}_total", dict(zip(
        ("source", "account", "folder"), LABELS, strict=True
    )))  # fmt: skip
    return value or 0.0


def _decide(exc: Exception, metrics: SourceMetrics, connecting: bool = False) -> float:
    return backoff_delay(
        exc,
        backoff=Backoff(initial=1.0, cap=60.0),
        metrics=metrics,
        labels=LABELS,
        connecting=connecting,
        connection_lost=ConnectionLost,
        logger=logging.getLogger("test.reconnect"),
    )


def test_a_bad_password_waits_the_cap_and_says_to_fix_the_configuration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = SourceMetrics()
    with caplog.at_level(logging.ERROR, "test.reconnect"):
        delay = _decide(AuthenticationError("login refused"), metrics, connecting=True)
    assert delay == 60.0
    assert _count(metrics, "auth_failures") == 1 and _count(metrics, "connect_failures") == 1
    assert "imap acct/INBOX: login refused; will retry in 60s (fix the config" in caplog.text


def test_a_lost_connection_backs_off_quietly_and_an_unexpected_error_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = SourceMetrics()
    with caplog.at_level(logging.WARNING, "test.reconnect"):
        assert 0 <= _decide(ConnectionLost("reset"), metrics) <= 1.0
        assert caplog.text == ""
        assert 0 <= _decide(TransactionAborted("abort"), metrics) <= 2.0
    assert "imap acct/INBOX: unexpected error" in caplog.text
    assert _count(metrics, "transaction_aborts") == 1 and _count(metrics, "auth_failures") == 0
