"""Change notifications over the built-in webhook: wake-ups for delta rounds, never the source
of truth; the sweep delivers what a lost notification did not announce."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.core.config import KafkaSettings, config_from_dict
from connectors.graph.source import GraphSource
from mailtap.dev.process import free_port
from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import running_server
from tests.integration.graph.graph_kafka import USER, imap_key, mime, read_events, source_config

WAIT_S = 60.0
CLIENT_STATE = "graph-client-state-7f1c"


def webhook_source(
    graph: GraphTestServer, kafka: KafkaSettings, tmp_path: Path, sweep: float
) -> GraphSource:
    pair = graph.issue_webhook_certificate(tmp_path / "hook")
    port = free_port()
    notifications: dict[str, Any] = {
        "mode": "webhook",
        "public_url": f"https://127.0.0.1:{port}",
        "listen_host": "127.0.0.1",
        "listen_port": port,
        "certificate_file": str(pair.certificate),
        "key_file": str(pair.key),
        "client_state": CLIENT_STATE,
    }
    raw = source_config(
        kafka,
        graph,
        tmp_path / "claims",
        sweep_interval_seconds=sweep,
        notifications=notifications,
    )
    return GraphSource.from_config(config_from_dict(raw), serve_health=False)


@pytest.fixture
def slow_sweep(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> Iterator[GraphSource]:
    """A source whose sweep (120 s) is far beyond the waits: what arrives came by notification."""
    src = webhook_source(graph_server, kafka, tmp_path, sweep=120.0)
    src.start()
    yield src
    src.stop()


def waiting(src: GraphSource) -> bool:
    """Subscribed, and the first round is over: the folder waits for a wake-up."""
    return bool(src.workers) and all(
        w.subscription_id is not None and w.state.value == "WAITING" for w in src.workers
    )


def published(src: GraphSource) -> int:
    return sum(w.events_published for w in src.workers)


def test_a_notification_starts_a_delta_round_long_before_the_sweep(
    graph_server: GraphTestServer, slow_sweep: GraphSource, kafka: KafkaSettings
) -> None:
    assert graph_server.wait_until(lambda: len(graph_server.subscriptions(USER)) == 1, WAIT_S)
    subscription = graph_server.subscriptions(USER)[0]
    assert subscription.client_state == CLIENT_STATE
    for n in range(3):
        graph_server.add_message(USER, mime(n))
    assert graph_server.wait_until(lambda: published(slow_sweep) == 3, 30)
    slow_sweep.stop()
    assert graph_server.subscriptions(USER) == []  # deleted at a clean stop
    assert sorted(k for k, _ in read_events(kafka)) == sorted(imap_key(mime(n)) for n in range(3))


def test_lifecycle_events_renew_or_recreate_the_subscription_and_trigger_a_round(
    graph_server: GraphTestServer, slow_sweep: GraphSource
) -> None:
    assert graph_server.wait_until(lambda: len(graph_server.subscriptions(USER)) == 1, WAIT_S)
    first = graph_server.subscriptions(USER)[0].subscription_id
    graph_server.send_lifecycle_event(first, "reauthorizationRequired")
    assert graph_server.wait_until(
        lambda: any(r.method == "PATCH" and first in r.path for r in graph_server.requests), 30
    )
    graph_server.send_lifecycle_event(first, "subscriptionRemoved")
    assert graph_server.wait_until(
        lambda: [s.subscription_id for s in graph_server.subscriptions(USER)] not in ([], [first]),
        30,
    )
    # Changes while the subscription was gone: "missed" makes a round find them.
    graph_server.add_message(USER, mime(1), notify=False)
    second = graph_server.subscriptions(USER)[0].subscription_id
    graph_server.send_lifecycle_event(second, "missed")
    assert graph_server.wait_until(lambda: published(slow_sweep) == 1, 30)


def test_a_notification_with_a_wrong_client_state_is_ignored(
    graph_server: GraphTestServer, slow_sweep: GraphSource
) -> None:
    assert graph_server.wait_until(lambda: waiting(slow_sweep), WAIT_S)
    subscription = graph_server.subscriptions(USER)[0].subscription_id
    graph_server.add_message(USER, mime(1), notify=False)
    assert slow_sweep.webhook is not None
    forged = {
        "value": [
            {"subscriptionId": subscription, "clientState": "forged", "changeType": "created"}
        ]
    }
    url = f"https://127.0.0.1:{slow_sweep.webhook.port}/notify"
    trust = ssl.create_default_context(cafile=str(graph_server.ca_file))
    answer = httpx2.post(url, json=forged, verify=trust)
    assert answer.status_code == 202 and slow_sweep.webhook.inbox.rejected == 1
    assert not graph_server.wait_until(lambda: published(slow_sweep) > 0, 3)


def test_dropped_notifications_the_sweep_still_delivers_the_mail(
    graph_server: GraphTestServer, kafka: KafkaSettings, tmp_path: Path
) -> None:
    src = webhook_source(graph_server, kafka, tmp_path, sweep=2.0)
    src.start()
    try:
        assert graph_server.wait_until(lambda: len(graph_server.subscriptions(USER)) == 1, WAIT_S)
        graph_server.drop_notifications()
        for n in range(2):
            graph_server.add_message(USER, mime(n))
        assert graph_server.wait_until(lambda: published(src) == 2, 30)
    finally:
        src.stop()
    assert len(graph_server.dropped_notifications) >= 2
    assert sorted(k for k, _ in read_events(kafka)) == sorted(imap_key(mime(n)) for n in range(2))


def test_notifications_through_event_hubs_wake_the_folder_up(
    services: Any, kafka: KafkaSettings, tmp_path: Path, unique: str
) -> None:
    """Graph writes notifications to an event hub; the source reads it as a Kafka topic (the
    session's broker stands for the Event Hubs namespace, as the test server models it)."""
    hub = f"graph-notifications-{unique}"
    admin = AdminClient({"bootstrap.servers": services.kafka.bootstrap_servers})
    for future in admin.create_topics([NewTopic(hub, 1, 1)]).values():
        future.result(30)
    with running_server(event_hubs_bootstrap=services.kafka.bootstrap_servers) as graph:
        notifications = {
            "mode": "eventhubs",
            "event_hub_url": f"EventHub:https://ns.servicebus.windows.net/eventhubname/{hub}"
            "?tenantId=contoso.com",
            "event_hubs": {"bootstrap_servers": services.kafka.bootstrap_servers},
            "client_state": CLIENT_STATE,
        }
        raw = source_config(
            kafka,
            graph,
            tmp_path / "claims",
            sweep_interval_seconds=120.0,
            notifications=notifications,
        )
        src = GraphSource.from_config(config_from_dict(raw), serve_health=False)
        src.start()
        try:
            assert src.event_hub is not None
            assert graph.wait_until(
                lambda: waiting(src) and src.event_hub.assigned.is_set(), WAIT_S
            )
            for n in range(2):
                graph.add_message(USER, mime(n))
            # The sweep is 120 s away: only a notification read from the hub gets them here.
            assert graph.wait_until(lambda: published(src) == 2, 30)
        finally:
            src.stop()
        assert graph.subscriptions(USER) == []
    assert sorted(k for k, _ in read_events(kafka)) == sorted(imap_key(mime(n)) for n in range(2))
