"""``mailtap dlq`` on a command that went to the DLQ for real: the relay was unreachable until
the sink gave up (max lifetime) -> FAILED + dead letter. After the relay is fixed, ``list``/``show``
find it, ``replay --reset-state`` sends it again and it is SENT exactly once; a second replay
sends nothing; ``drop`` hides it from ``list``."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from smtp_harness import TopicReader, command, produce_commands, sink_config
from smtp_scripted_server import ScriptedRelay
from test_smtp_sink_scripted import final_for, run_until

from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.sink import SmtpSink
from mailtap.cli import main
from mailtap.dev.services import DevServices

pytestmark = pytest.mark.integration


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def cli(config: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["dlq", *args[:1], "-c", str(config), *args[1:]])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def status(config: Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["status", "-c", str(config), "--json", "--window", "600"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return dict(json.loads(result.stdout))


async def test_dead_letter_listed_shown_replayed_once_and_dropped(
    services: DevServices, unique: str, relay: ScriptedRelay, tmp_path: Path
) -> None:
    # 1. The relay is unreachable: DEFERRED until max_lifetime, then FAILED and dead-lettered.
    cfg, settings, raw = sink_config(
        services.bootstrap_servers, unique, closed_port(), max_lifetime="3s"
    )
    cmd = command(["ok@example.org"])
    produce_commands(cfg, [cmd])
    events = TopicReader(cfg, cfg.kafka.topics.delivery)
    got = await run_until(
        SmtpSink(cfg, settings), events, lambda ev: final_for(ev, ["ok@example.org"])
    )
    assert got[-1]["status"] == "FAILED"

    # 2. Fixed: the sink's config now names the working relay.
    raw["smtp"]["port"] = relay.port
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(yaml.safe_dump(raw))
    listed = [json.loads(line) for line in cli(fixed, "list", "--json").splitlines()]
    assert [(r["key"], r["kind"], r["error_class"]) for r in listed] == [
        (cmd["command_id"], "command", "GiveUp")
    ]
    assert "max lifetime" in listed[0]["reason"]
    shown = json.loads(cli(fixed, "show", listed[0]["id"]))
    assert shown["headers"]["mailtap.error.class"] == "GiveUp"
    assert shown["value"]["record"]["command_id"] == cmd["command_id"]
    assert shown["value"]["record"]["to"][0]["address"] == "ok@example.org"
    assert cli(fixed, "list", "--error-class", "Nope") == ""

    dry = cli(fixed, "replay", "--key", cmd["command_id"], "--dry-run")
    assert "1 to replay (dry run)" in dry
    assert "1 replayed" in cli(fixed, "replay", "--key", cmd["command_id"], "--reset-state")

    # 3. A sink started after the replay (it reads its state at start) sends it: SENT once.
    fixed_cfg = _load(fixed)
    settings = fixed_cfg.section("smtp", SmtpSinkSettings)
    got = await run_until(
        SmtpSink(fixed_cfg, settings),
        events,
        lambda ev: any(e["status"] == "SENT" for e in ev),
    )
    assert [e["status"] for e in got if e["command_id"] == cmd["command_id"]][-1] == "SENT"
    assert sum(relay.handler.deliveries.values()) == 1

    # 4. Replaying again sends nothing: the command is SENT.
    again = cli(fixed, "replay", "--key", cmd["command_id"], "--reset-state")
    assert "already SENT" in again and "0 to replay" in again

    # 4b. Even a copy that reaches the commands topic is not sent: the sink skips DONE ids.
    produce_commands(fixed_cfg, [cmd])
    sink = SmtpSink(fixed_cfg, settings)
    await run_until(sink, events, lambda _: sink.records_total >= 1)
    assert sum(relay.handler.deliveries.values()) == 1

    # 5. Dropped: gone from list and from status' count, still there with --all.
    assert status(fixed)["commands_dlq_records"] == 1
    assert "1 dropped" in cli(fixed, "drop", "--key", cmd["command_id"], "--reason", "handled")
    assert cli(fixed, "list") == ""
    assert "DROPPED" in cli(fixed, "list", "--all")
    report = status(fixed)
    assert report["commands_dlq_records"] == 0
    assert report["deliveries_in_window"]["SENT"] == 1
    assert report["deliveries_in_window"]["FAILED"] == 1
    events.close()


def _load(path: Path) -> Any:
    from connectors.core.config import load_config

    return load_config(str(path))
