"""Operating the whole product on the real services: every component's ``/metrics`` moves when a
mail flows (Dovecot → IMAP source → Kafka → streams → SMTP sink → the SMTP server), ``mailtap
status`` reads the cursor, the events, the lag and the deliveries back from Kafka, and every
metric the shipped alert rules and dashboard use is exported by a running component."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from imapclient import IMAPClient
from test_whole_pipeline import _config, _ours

from mailtap.components import Component, wait_for
from mailtap.dev import scenario
from mailtap.dev.process import free_ports
from tests.support.scrape import Samples, families, healthz, scrape, total

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
STAGE_S = 180.0
COMPONENTS = ("imap-source", "streams", "smtp-sink")


def _scrape_or_none(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None


def metric_names_used() -> set[str]:
    """Metric names in deploy/observability's rules and dashboard (series selectors)."""
    rules = (REPO / "deploy/observability/mailtap-alerts.yaml").read_text()
    dashboard = (REPO / "deploy/observability/mailtap-dashboard.json").read_text()
    exprs = [r["expr"] for g in yaml.safe_load(rules)["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in json.loads(dashboard)["panels"] for t in p.get("targets", [])]
    found = set()
    for expr in exprs:
        found |= set(re.findall(r"\b(mailtap_[a-z_]+)\b", expr))
    return found


def test_metrics_status_and_alert_names_on_a_running_pipeline(
    services, unique, tmp_path: Path
) -> None:
    user = services.add_user(f"op-{unique}@example.com", "pw")
    base = _config(services, unique, user, tmp_path, f"streams-{unique}")
    ports = dict(zip(COMPONENTS, free_ports(len(COMPONENTS)), strict=True))
    components = {}
    for name in COMPONENTS:
        doc = yaml.safe_load(base.read_text())
        doc["health"] = {"host": "127.0.0.1", "port": ports[name]}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        components[name] = Component(name, path, tmp_path / "logs" / f"{name}.log")
    ticket = scenario.ticket_request(unique)
    try:
        for component in components.values():
            component.start()
        for name, port in ports.items():
            assert wait_for(lambda p=port: _scrape_or_none(p) is not None, STAGE_S), components[
                name
            ].log_tail()
        before = {name: scrape(port) for name, port in ports.items()}
        for name, samples in before.items():
            assert total(samples, "mailtap_build_info") == 1, name
        with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
            client.login(user.username, user.password)
            client.append("INBOX", ticket.raw)
        assert wait_for(lambda: len(_ours(services, unique)) >= 1, STAGE_S), components[
            "smtp-sink"
        ].log_tail()

        def moved() -> bool:
            source = scrape(ports["imap-source"])
            streams = scrape(ports["streams"])
            sink = scrape(ports["smtp-sink"])
            return (
                total(source, "mailtap_events_produced_total") >= 1
                and total(streams, "mailtap_streams_commands_emitted_total") >= 1
                and total(sink, "mailtap_smtp_outcomes_total", status="SENT") >= 1
                # The lag gauge is set at the end of the round that counted the SENT outcome
                # (a partition has no position before its first record): a scrape can fall
                # between the two.
                and any(n == "mailtap_smtp_consumer_lag" for n, _ in sink)
            )

        assert wait_for(moved, STAGE_S)
        after = {name: scrape(port) for name, port in ports.items()}
        source = after["imap-source"]
        assert total(source, "mailtap_source_mailboxes", source="imap") == 1
        assert (
            total(source, "mailtap_source_state", state="IDLE")
            + total(source, "mailtap_source_state", state="POLLING")
            == 1
        )
        assert total(after["smtp-sink"], "mailtap_smtp_assigned_partitions") >= 1
        sink_lag = [
            dict(lab) for (n, lab) in after["smtp-sink"] if n == "mailtap_smtp_consumer_lag"
        ]
        assert f"mail.commands.{unique}" in {lab["topic"] for lab in sink_lag}
        assert total(after["streams"], "mailtap_streams_records_processed_total") >= 1
        for name, port in ports.items():
            assert wait_for(lambda p=port: healthz(p)[0] == 200, STAGE_S), (name, healthz(port))

        # mailtap status, as an operator runs it, against the same cluster.
        env = {**os.environ, "PYTHONPATH": str(REPO)}

        def status() -> dict:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "mailtap.cli",
                    "status",
                    "-c",
                    str(base),
                    "--json",
                    "--health",
                    f"http://127.0.0.1:{ports['smtp-sink']}/healthz",
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
                check=True,
            ).stdout
            return json.loads(out)  # type: ignore[no-any-return]

        reports: list[dict] = []

        def streams_committed() -> bool:
            reports.append(status())
            lag = reports[-1]["lag"][f"streams-{unique}"][f"mail.events.{unique}"]
            return any(v is not None for v in lag.values())

        # faust commits its offsets every commit_interval: until it has, the group's lag is
        # unknown (None) — wait for that commit instead of racing it on a loaded machine.
        assert wait_for(streams_committed, 60, 2), reports[-1]["lag"]
        report = reports[-1]
        box = report["mailboxes"][f"imap/pipe-{unique}/INBOX"]
        assert box["cursor"]["last_uid"] >= 1 and box["cursor_written_at"]
        assert box["events_in_window"] >= 1 and box["last_event_at"]
        assert box["dlq_records"] == 0
        assert report["deliveries_in_window"].get("SENT", 0) >= 1
        assert report["bounce_rate"] == 0.0
        streams_lag = report["lag"][f"streams-{unique}"][f"mail.events.{unique}"]
        assert streams_lag and any(lag is not None and lag >= 0 for lag in streams_lag.values())
        assert f"mail.commands.{unique}" in report["lag"][f"sink-{unique}"]
        assert report["health"][f"http://127.0.0.1:{ports['smtp-sink']}/healthz"]["ok"] is True

        # Every metric the alert rules and the dashboard query is exported by a running component.
        exported = set().union(*(families(port) for port in ports.values()))
        exported = {n.removesuffix("_total") for n in exported}
        missing = {n.removesuffix("_total") for n in metric_names_used()} - exported
        assert not missing, f"used by deploy/observability but not exported: {sorted(missing)}"
    finally:
        for component in components.values():
            component.stop()
