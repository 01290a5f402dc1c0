"""Log output: ``--log-format json`` gives one JSON object per line with each record's fields."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from pythonjsonlogger.json import JsonFormatter

from connectors.imap.state import StateMachine, WorkerState
from mailtap import logs
from mailtap.cli import main


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger back as pytest had it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_state_transition_is_one_json_line_with_its_fields(
    root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure(logging.INFO, "json")
    StateMachine("acct", "INBOX").to(WorkerState.CONNECTING, "start")
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "INFO" and record["logger"] == "connectors.imap.state"
    assert record["message"] == "imap acct/INBOX: DISCONNECTED -> CONNECTING (start)"
    assert (record["account"], record["folder"], record["state"]) == ("acct", "INBOX", "CONNECTING")
    assert record["timestamp"].endswith("+00:00")


def test_text_stays_one_readable_line(
    root_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure(logging.INFO, "text")
    StateMachine("acct", "INBOX").to(WorkerState.CONNECTING)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("INFO connectors.imap.state imap acct/INBOX: DISCONNECTED -> CONNECTING")


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--log-format", "json"], {}), ([], {"MAILTAP_LOG_FORMAT": "json"})],
)
def test_the_command_line_and_the_environment_choose_json(
    root_logging: None, args: list[str], env: dict[str, str]
) -> None:
    result = CliRunner(env=env).invoke(main, [*args, "config", "reference"])
    assert result.exit_code == 0, result.output
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler.formatter, JsonFormatter)
    bad = CliRunner().invoke(main, ["--log-format", "xml", "config", "reference"])
    assert bad.exit_code == 2 and "'xml' is not one of 'text', 'json'" in bad.output


def test_a_thread_that_dies_is_a_json_record_not_a_raw_traceback(
    root_logging: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from connectors.core import stopping
    from connectors.core.kafka import clients as kafka

    logs.configure(logging.INFO, "json")
    monkeypatch.setattr(threading, "excepthook", logs.log_thread_exception)
    monkeypatch.setattr(stopping, "STOP", threading.Event())

    def fail() -> None:
        raise RuntimeError("consumer thread broke")

    thread = threading.Thread(target=fail, name="consumer")
    thread.start()
    thread.join()
    kafka.request_stop()  # while stopping: one warning line, no traceback
    thread = threading.Thread(target=fail, name="consumer")
    thread.start()
    thread.join()
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["level"] == "ERROR" and first["message"] == "thread consumer failed"
    assert "RuntimeError: consumer thread broke" in first["exc_info"]
    assert second["level"] == "WARNING"
    assert (
        second["message"]
        == "thread consumer ended while stopping: RuntimeError consumer thread broke"
    )
    assert "exc_info" not in second
