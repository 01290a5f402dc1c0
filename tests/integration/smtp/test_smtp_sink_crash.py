"""kill -9 of the sink between intent and outcome, then a restart (the sink runs as a subprocess)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from smtp_harness import WAIT_S, TopicReader, command, produce_commands, sink_config
from smtp_scripted_server import ScriptedRelay

from connectors.core import checkpoints
from connectors.smtp.identity import message_id_for
from mailtap.dev import DevServices
from tests.support.crashpoints import ENV as CRASH_ENV
from tests.support.crashpoints import EXIT_CODE, crash_env

REPO = Path(__file__).resolve().parents[3]
RUNNER = (
    "import logging, sys; logging.basicConfig(level=logging.INFO); "
    "from mailtap.commands.smtp import run_smtp_sink; run_smtp_sink(sys.argv[1])"
)


#: Where each test kills the sink: the first time it passes that checkpoint.
CRASH_AT = {"kill_after_intent": "after_intent:1", "kill_after_send": "after_send:1"}


def start_sink(config: Path, log: Path, hook: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in (CRASH_ENV, checkpoints.ENV):
        env.pop(name, None)
    if hook:
        env.update(crash_env(CRASH_AT[hook]))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(config)], env=env, stdout=out, stderr=out
        )


def start_cli_sink(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``mailtap run smtp-sink -c CONFIG`` as a user starts it: default log level, own session."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in (CRASH_ENV, checkpoints.ENV, "MAILTAP_LOG_LEVEL", "MAILTAP_LOG_FORMAT"):
        env.pop(name, None)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "smtp-sink", "-c", str(config)],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
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
    cfg, settings, raw = sink_config(services.bootstrap_servers, unique, relay.port)
    config = tmp_path / "mailtap.yaml"
    config.write_text(yaml.safe_dump(raw))
    log = tmp_path / "sink.log"
    cmds = [command([f"user{i}@example.org"]) for i in range(3)]
    produce_commands(cfg, cmds)

    crashed = start_sink(config, log, hook)
    assert crashed.wait(timeout=WAIT_S) == EXIT_CODE, log.read_text()
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
    # The commands in flight when the process died (at most a pool's worth, not the whole
    # batch) are reported UNKNOWN once.
    assert 1 <= sum(unknown.values()) <= settings.pool_size < len(cmds)
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
            # Every send in flight had its reply before the kill: only an UNKNOWN attempt is
            # sent again, and with the same Message-ID.
            assert deliveries[f"<{message_id}>"] == 1 + unknown[cid]
    events.close()


KILLS = 5
POOL_SIZE = 4


def test_kill_9_at_random_moments_resends_at_most_the_pool(
    services: DevServices, unique: str, relay: ScriptedRelay, tmp_path: Path
) -> None:
    """Several kill -9 mid-batch under a send rate limit: each kill costs at most ``pool_size``
    second copies (the mails on the wire), however large the batch; everything ends SENT once,
    plus a copy only for an attempt reported UNKNOWN, always with the same Message-ID."""
    cfg, _settings, raw = sink_config(
        services.bootstrap_servers,
        unique,
        relay.port,
        pool_size=POOL_SIZE,
        # Slow enough for a kill to land while a batch of 200 is on its way out, and a wait
        # budget that lets a whole batch through instead of deferring its tail.
        rate={"per_minute": 1200, "burst": 1},
        max_rate_wait=60,
    )
    config = tmp_path / "mailtap.yaml"
    config.write_text(yaml.safe_dump(raw))
    cmds = [command([f"user{i}@example.org"]) for i in range(300)]
    produce_commands(cfg, cmds)
    rng = random.Random(unique)

    def sending(proc: subprocess.Popen[bytes], beyond: int) -> bool:
        return len(relay.handler.snapshot()) > beyond or proc.poll() is not None

    # Index into the relay's accepted list at each kill: a copy before it and one after it is
    # a duplicate caused by that kill (or an earlier one).
    boundaries: list[int] = []
    logs: list[Path] = []
    for kill in range(KILLS):
        logs.append(tmp_path / f"sink-{kill}.log")
        proc = start_cli_sink(config, logs[-1])
        try:
            # Mid-batch: this process has put more than a pool's worth on the wire already.
            wait_for(
                partial(sending, proc, len(relay.handler.snapshot()) + POOL_SIZE),
                f"sink {kill} sending",
            )
            assert proc.poll() is None, logs[-1].read_text()
            time.sleep(rng.uniform(0.0, 1.5))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=WAIT_S)
        time.sleep(0.5)  # a final "." already in the relay's socket buffer is answered now
        boundaries.append(len(relay.handler.snapshot()))

    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    logs.append(tmp_path / "sink-final.log")
    final = start_cli_sink(config, logs[-1])
    try:

        def all_sent() -> bool:
            events.poll(0.2)
            assert final.poll() is None, logs[-1].read_text()
            return {e["command_id"] for e in events.values if e["status"] == "SENT"} == {
                c["command_id"] for c in cmds
            }

        wait_for(all_sent, "every command SENT after the last restart")
    finally:
        os.killpg(final.pid, signal.SIGTERM)
        assert final.wait(timeout=WAIT_S) == 0, logs[-1].read_text()
    events.drain()
    events.close()

    accepted = [a.message_id for a in relay.handler.snapshot()]
    first_seen: dict[str, int] = {}
    duplicates_per_kill = Counter[int]()
    for index, message_id in enumerate(accepted):
        if message_id not in first_seen:
            first_seen[message_id] = index
            continue
        # The kill that interrupted the first copy's recording: the first boundary after it.
        kill = next(k for k, b in enumerate(boundaries) if b > first_seen[message_id])
        duplicates_per_kill[kill] += 1
    copies = Counter(accepted)
    print(f"kills={KILLS} pool={POOL_SIZE} duplicates per kill={dict(duplicates_per_kill)}")
    expected_ids = {f"<{message_id_for(c['command_id'], 'example.com')}>" for c in cmds}
    assert set(copies) == expected_ids
    assert all(n <= POOL_SIZE for n in duplicates_per_kill.values()), (
        f"duplicates per kill {dict(duplicates_per_kill)} exceed the pool size {POOL_SIZE}"
    )
    unknown = Counter(e["command_id"] for e in events.values if e["status"] == "UNKNOWN")
    for cmd in cmds:
        message_id = message_id_for(cmd["command_id"], "example.com")
        mine = [e for e in events.values if e["command_id"] == cmd["command_id"]]
        assert {e["message_id"] for e in mine} == {message_id}
        assert [e["status"] for e in mine].count("SENT") == 1
        # A second copy only ever follows an attempt reported UNKNOWN.
        assert copies[f"<{message_id}>"] <= 1 + unknown[cmd["command_id"]]
    # Each kill leaves at most the pool's mails UNKNOWN, not the rest of its batch.
    assert sum(unknown.values()) <= KILLS * POOL_SIZE, unknown
    # A started sink says so once, at the default log level.
    for log in logs:
        assert log.read_text().count("smtp sink started") == 1, log.read_text()
