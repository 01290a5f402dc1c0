"""Exactly once across crashes: kill -9 of a ``mailtap run graph-source`` process during a
backfill and during live changes, and a zombie instance fenced by the next one."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from connectors.core.config import KafkaSettings, MailtapConfig
from connectors.graph.source import GraphSource
from tests.graph_server import GraphTestServer
from tests.integration.graph.graph_kafka import (
    USER,
    imap_key,
    mime,
    read_events,
    read_topic,
    source_config,
)
from tests.support.crashpoints import EXIT_CODE, crash_env
from tests.support.sourceproc import ENV, REPO, restarted
from tests.support.sourceproc import source_command as run_command

WAIT_S = 60.0


def source_command(
    kafka: KafkaSettings, graph: GraphTestServer, tmp_path: Path, **overrides: object
) -> list[str]:
    config = source_config(kafka, graph, tmp_path / "claims", **overrides)
    return run_command("mailtap.commands.graph:run_graph_source", config, tmp_path)


def restart_and_expect(
    run: list[str], graph: GraphTestServer, kafka: KafkaSettings, raws: list[bytes]
) -> None:
    """Run the source again until every mail is in Kafka, then check: each key exactly once."""
    with restarted(run, WAIT_S):
        assert graph.wait_until(lambda: len(read_events(kafka)) >= len(raws), WAIT_S)
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted(imap_key(raw) for raw in raws)


def test_kill_9_inside_a_backfill_transaction_then_restart_loses_and_duplicates_nothing(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raws = [mime(n) for n in range(5)]
    for raw in raws[:3]:
        graph_server.add_message(USER, raw)
    run = source_command(kafka, graph_server, tmp_path, batch_size=2)
    # Page 1 (mails 0-1) commits; the process dies inside page 2's transaction (mail 2 on the
    # broker, uncommitted).
    crashed = subprocess.run(
        run,
        env={**ENV, **crash_env("in_transaction:2")},
        cwd=REPO,
        timeout=WAIT_S,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == EXIT_CODE, crashed.stderr[-2000:]
    assert len(read_topic(kafka, kafka.topics.events, isolation="read_uncommitted")) == 3
    assert len(read_events(kafka, settled=False)) == 2
    for raw in raws[3:]:  # mail keeps arriving while the source is down
        graph_server.add_message(USER, raw)
    restart_and_expect(run, graph_server, kafka, raws)


def test_sigkill_during_live_changes_then_restart_loses_and_duplicates_nothing(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    raws = [mime(n) for n in range(30)]
    graph_server.add_message(USER, raws[0])
    run = source_command(kafka, graph_server, tmp_path, batch_size=2)
    first = subprocess.Popen(run, env=ENV, cwd=REPO, stderr=subprocess.DEVNULL)
    try:
        assert graph_server.wait_until(lambda: len(read_events(kafka, settled=False)) >= 1, WAIT_S)
        # Live: mail arrives while the source follows the delta link; a SIGKILL lands somewhere
        # among the rounds that fetch and commit it.
        for raw in raws[1:20]:
            graph_server.add_message(USER, raw)
        assert graph_server.wait_until(lambda: len(read_events(kafka, settled=False)) >= 6, WAIT_S)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=WAIT_S)
    assert first.returncode == -signal.SIGKILL
    for raw in raws[20:]:
        graph_server.add_message(USER, raw)
    restart_and_expect(run, graph_server, kafka, raws)


def test_a_zombie_is_fenced_by_the_next_instance_and_no_key_is_published_twice(
    graph_server: GraphTestServer, config: MailtapConfig, kafka: KafkaSettings
) -> None:
    for n in range(3):
        graph_server.add_message(USER, mime(n))
    zombie = GraphSource.from_config(config, serve_health=False)
    zombie.start()
    successor = GraphSource.from_config(config, serve_health=False)
    try:
        assert graph_server.wait_until(
            lambda: sum(w.events_published for w in zombie.workers) == 3, WAIT_S
        )
        successor.start()  # init_transactions with the same transactional id: fences the zombie
        # The successor's worker runs init_transactions in its thread, after start() returned:
        # mail added before then may still go through the zombie (once, as the keys check
        # below says), and the successor would never count 3. The zombie learns it is fenced
        # at its next commit (every sweep commits its cursor).
        assert graph_server.wait_until(lambda: zombie.workers[0].fenced, WAIT_S)
        for n in range(3, 6):
            graph_server.add_message(USER, mime(n))
        assert graph_server.wait_until(
            lambda: sum(w.events_published for w in successor.workers) == 3, WAIT_S
        )
    finally:
        zombie.stop()
        successor.stop()
    assert zombie.workers[0].state.value == "STOPPED"
    keys = [k for k, _ in read_events(kafka)]
    assert sorted(keys) == sorted(imap_key(mime(n)) for n in range(6))
