"""kill -9 of the sink between intent and outcome, then a restart (the sink runs as a subprocess)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from smtp_harness import WAIT_S, TopicReader, command, produce_commands, sink_config
from smtp_scripted_server import ScriptedRelay

from connectors.smtp.identity import message_id_for
from connectors.smtp.sink import TEST_HOOK_ENV
from mailtap.dev import DevServices

REPO = Path(__file__).resolve().parents[3]
RUNNER = (
    "import logging, sys; logging.basicConfig(level=logging.INFO); "
    "from mailtap.commands.smtp import run_smtp_sink; run_smtp_sink(sys.argv[1])"
)


def start_sink(config: Path, log: Path, hook: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(TEST_HOOK_ENV, None)
    if hook:
        env[TEST_HOOK_ENV] = hook
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(config)], env=env, stdout=out, stderr=out
        )


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("hook", ["kill_after_intent", "kill_after_send"])
def test_kill_9_between_intent_and_outcome(
    services: DevServices, unique: str, relay: ScriptedRelay, tmp_path: Path, hook: str
) -> None:
    cfg, _settings, raw = sink_config(services.bootstrap_servers, unique, relay.port)
    config = tmp_path / "mailtap.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = tmp_path / "sink.log"
    cmds = [command([f"user{i}@example.org"]) for i in range(3)]
    produce_commands(cfg, cmds)

    crashed = start_sink(config, log, hook)
    assert crashed.wait(timeout=WAIT_S) == -signal.SIGKILL, log.read_text()
    sent_before_restart = len(relay.handler.snapshot())
    if hook == "kill_after_intent":
        assert sent_before_restart == 0
    else:
        assert sent_before_restart >= 1

    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    restarted = start_sink(config, log, None)
    try:

        def all_sent() -> bool:
            events.poll(0.2)
            return {e["command_id"] for e in events.values if e["status"] == "SENT"} == {
                c["command_id"] for c in cmds
            }

        wait_for(all_sent, "every command SENT after the restart")
        # The log is shared with the killed process: the restarted one's endpoint is the last.
        urls = re.findall(r"health endpoint on (http://\S+/healthz)", log.read_text())
        assert urls, log.read_text()
        with urllib.request.urlopen(urls[-1], timeout=10) as reply:
            assert reply.status == 200 and json.load(reply)["ok"] is True
        with urllib.request.urlopen(urls[-1].replace("/healthz", "/metrics"), timeout=10) as reply:
            assert 'mailtap_smtp_outcomes_total{status="SENT"}' in reply.read().decode()
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(timeout=WAIT_S) == 0, log.read_text()

    deliveries = Counter(a.message_id for a in relay.handler.snapshot())
    unknown = Counter(e["command_id"] for e in events.values if e["status"] == "UNKNOWN")
    # Every command of the batch in flight when the process died is reported UNKNOWN once.
    assert sum(unknown.values()) >= 1
    if hook == "kill_after_send":
        assert sum(unknown.values()) == sent_before_restart
    for cmd in cmds:
        cid = cmd["command_id"]
        message_id = message_id_for(cid, "example.com")
        mine = [e for e in events.values if e["command_id"] == cid]
        assert {e["message_id"] for e in mine} == {message_id}
        assert [e["status"] for e in mine][-1] == "SENT"
        if hook == "kill_after_intent":
            # Never reached the relay before the crash: sent exactly once, after the restart.
            assert deliveries[f"<{message_id}>"] == 1
        else:
            # Only an UNKNOWN attempt is sent again, and with the same Message-ID.
            assert deliveries[f"<{message_id}>"] == 1 + unknown[cid]
    events.close()
