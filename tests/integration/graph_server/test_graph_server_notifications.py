"""Change notifications of the Graph test server: subscriptions, the validation handshake,
webhook delivery with resends, lifecycle events, fault switches; Event Hubs over Kafka."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import USER, app_token, running_server, trusting_session
from tests.graph_server.receiver import WebhookReceiver

IMMUTABLE = 'IdType="ImmutableId"'
STATE = "client-state-secret"


def mime(n: int) -> bytes:
    return f"From: a@example.org\r\nTo: {USER}\r\nSubject: s{n}\r\nMessage-ID: <n{n}@example.org>\r\n\r\nx\r\n".encode()


@pytest.fixture
def receiver(graph_server: GraphTestServer, tmp_path: Path) -> Iterator[WebhookReceiver]:
    with WebhookReceiver(graph_server, tmp_path / "webhook") as endpoint:
        yield endpoint


@pytest.fixture
def client(graph_server: GraphTestServer) -> requests.Session:
    session = trusting_session(graph_server)
    session.headers["Authorization"] = f"Bearer {app_token(graph_server)}"
    return session


def expires_in(minutes: float) -> str:
    return (datetime.now(UTC) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.0000000Z")


def subscribe(
    graph: GraphTestServer,
    client: requests.Session,
    notification_url: str,
    lifecycle_url: str | None = None,
    *,
    resource: str = f"users/{USER}/mailFolders('inbox')/messages",
    minutes: float = 60,
    prefer: str = IMMUTABLE,
) -> requests.Response:
    body: dict[str, Any] = {
        "changeType": "created,updated,deleted",
        "notificationUrl": notification_url,
        "resource": resource,
        "expirationDateTime": expires_in(minutes),
        "clientState": STATE,
    }
    if lifecycle_url is not None:
        body["lifecycleNotificationUrl"] = lifecycle_url
    return client.post(f"{graph.graph_url}/subscriptions", json=body, headers={"Prefer": prefer})


def test_subscription_validates_both_urls_and_notifies_changes(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    created = subscribe(graph_server, client, receiver.url(), receiver.url("/lifecycle"))
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["clientState"] == STATE
    assert body["changeType"] == "created,updated,deleted"
    assert body["expirationDateTime"].endswith("Z")
    assert len(receiver.validations) == 2  # notificationUrl and lifecycleNotificationUrl
    message = graph_server.add_message(USER, mime(1))
    graph_server.update_message(USER, message.immutable_id, is_read=True)
    graph_server.delete_message(USER, message.immutable_id)
    received = receiver.wait_for(3, "/notify")
    assert [n["changeType"] for n in received] == ["created", "updated", "deleted"]
    first = received[0]
    assert first["subscriptionId"] == body["id"]
    assert first["clientState"] == STATE
    assert first["tenantId"] == graph_server.tenant
    assert first["resourceData"]["id"] == message.immutable_id  # ImmutableId on creation
    assert first["resourceData"]["@odata.type"] == "#Microsoft.Graph.Message"
    assert first["resource"].endswith(f"/Messages/{message.immutable_id}")
    # Another folder is not this subscription's.
    graph_server.add_message(USER, mime(2), folder="archive")
    assert not graph_server.wait_until(lambda: len(receiver.notifications("/notify")) > 3, 1.0)


def test_default_ids_in_notifications_without_the_preference(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    assert subscribe(graph_server, client, receiver.url(), prefer="").status_code == 201
    message = graph_server.add_message(USER, mime(1))
    (notification,) = receiver.wait_for(1)
    assert notification["resourceData"]["id"] == message.rest_id


def test_failed_validation_creates_no_subscription(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    receiver.echo_validation = False
    refused = subscribe(graph_server, client, receiver.url())
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "ValidationError"
    assert graph_server.subscriptions() == []
    plain_http = subscribe(graph_server, client, "http://127.0.0.1:9/notify")
    assert plain_http.status_code == 400
    assert "HTTPS" in plain_http.json()["error"]["message"]


def test_expiration_limit_renewal_and_delete(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    too_long = subscribe(graph_server, client, receiver.url(), minutes=10080 + 5)
    assert too_long.status_code == 400
    assert "10080 minutes" in too_long.json()["error"]["message"]
    subscription = subscribe(graph_server, client, receiver.url(), minutes=10079).json()
    url = f"{graph_server.graph_url}/subscriptions/{subscription['id']}"
    renewed = client.patch(url, json={"expirationDateTime": expires_in(120)})
    assert renewed.status_code == 200
    assert renewed.json()["expirationDateTime"] < subscription["expirationDateTime"]
    listed = client.get(f"{graph_server.graph_url}/subscriptions").json()["value"]
    assert [s["id"] for s in listed] == [subscription["id"]]
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404
    graph_server.add_message(USER, mime(1))
    assert not graph_server.wait_until(lambda: bool(receiver.notifications()), 0.5)


def test_undelivered_notification_is_resent(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    assert subscribe(graph_server, client, receiver.url()).status_code == 201
    receiver.status = 500
    graph_server.add_message(USER, mime(1))
    assert graph_server.wait_until(lambda: len(graph_server.deliveries) >= 1, 10)
    receiver.status = 202
    assert graph_server.wait_until(
        lambda: any(d.status == 202 for d in graph_server.deliveries), 10
    )
    attempts = [(d.attempt, d.status) for d in graph_server.deliveries]
    assert attempts[0] == (1, 500)
    assert attempts[-1][1] == 202 and attempts[-1][0] >= 2


def test_dropped_notifications_never_arrive_but_delta_sees_the_mail(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    assert subscribe(graph_server, client, receiver.url()).status_code == 201
    graph_server.drop_notifications(1)
    lost = graph_server.add_message(USER, mime(1))
    kept = graph_server.add_message(USER, mime(2))
    (notification,) = receiver.wait_for(1)
    assert notification["resourceData"]["id"] == kept.immutable_id
    assert [n["resourceData"]["id"] for n in graph_server.dropped_notifications] == [
        lost.immutable_id
    ]
    delta = client.get(
        f"{graph_server.graph_url}/users/{USER}/mailFolders/inbox/messages/delta",
        headers={"Prefer": IMMUTABLE},
    ).json()
    assert {m["id"] for m in delta["value"]} == {lost.immutable_id, kept.immutable_id}


def test_lifecycle_events(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    subscription = subscribe(
        graph_server, client, receiver.url(), receiver.url("/lifecycle")
    ).json()
    sid = subscription["id"]
    graph_server.send_lifecycle_event(sid, "reauthorizationRequired")
    (event,) = receiver.wait_for(1, "/lifecycle")
    assert event == {
        "subscriptionId": sid,
        "subscriptionExpirationDateTime": subscription["expirationDateTime"],
        "tenantId": graph_server.tenant,
        "clientState": STATE,
        "lifecycleEvent": "reauthorizationRequired",
    }
    graph_server.add_message(USER, mime(1))  # paused: lost
    reauthorized = client.post(f"{graph_server.graph_url}/subscriptions/{sid}/reauthorize")
    assert reauthorized.status_code == 204
    after = graph_server.add_message(USER, mime(2))
    (notification,) = receiver.wait_for(1, "/notify")
    assert notification["resourceData"]["id"] == after.immutable_id
    graph_server.send_lifecycle_event(sid, "missed")
    graph_server.send_lifecycle_event(sid, "subscriptionRemoved")
    events = receiver.wait_for(3, "/lifecycle")
    assert [e["lifecycleEvent"] for e in events] == [
        "reauthorizationRequired",
        "missed",
        "subscriptionRemoved",
    ]
    assert client.get(f"{graph_server.graph_url}/subscriptions/{sid}").status_code == 404


def _consume(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"eh-{topic}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    found: list[dict[str, Any]] = []
    deadline = datetime.now(UTC) + timedelta(seconds=timeout)
    try:
        while len(found) < count and datetime.now(UTC) < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                found.append(json.loads(record.value()))
    finally:
        consumer.close()
    return found


def test_event_hubs_delivery_through_kafka(services: Any, unique: str) -> None:
    """Event Hubs speaks Kafka: the notification collections land as JSON on the hub's topic,
    after the documented validation message."""
    bootstrap = services.kafka.bootstrap_servers
    hub = f"graph-notifications-{unique}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(hub, 1, 1)])[hub].result(30)
    del admin
    with running_server(event_hubs_bootstrap=bootstrap) as graph:
        session = trusting_session(graph)
        session.headers["Authorization"] = f"Bearer {app_token(graph)}"
        url = f"EventHub:https://mailtap-ns.servicebus.windows.net/eventhubname/{hub}?tenantId=example.com"
        created = subscribe(graph, session, url)
        assert created.status_code == 201, created.text
        missing = subscribe(graph, session, url.replace(hub, f"{hub}-missing"))
        assert missing.status_code == 400
        assert "does not exist" in missing.json()["error"]["message"]
        message = graph.add_message(USER, mime(1))
        validation, collection = _consume(bootstrap, hub, 2)
    assert validation["value"][0]["subscriptionId"] == "NA"
    assert validation["value"][0]["changeType"].startswith("Validation: Testing client application")
    (notification,) = collection["value"]
    assert notification["subscriptionId"] == created.json()["id"]
    assert notification["changeType"] == "created"
    assert notification["clientState"] == STATE
    assert notification["resourceData"]["id"] == message.immutable_id


def test_slow_webhook_gets_the_notification_again(
    graph_server: GraphTestServer, client: requests.Session, receiver: WebhookReceiver
) -> None:
    """An answer later than 3 s counts as undelivered: Graph sends the same notification again,
    so a receiver sees it twice (dedupe is the receiver's job)."""
    assert subscribe(graph_server, client, receiver.url()).status_code == 201
    receiver.delay = 3.5
    message = graph_server.add_message(USER, mime(1))
    first = receiver.wait_for(1)
    receiver.delay = 0.0
    both = receiver.wait_for(2, timeout=20)
    assert [n["resourceData"]["id"] for n in both] == [message.immutable_id] * 2
    assert first[0] == both[1]
    assert graph_server.wait_until(lambda: len(graph_server.deliveries) >= 2, 10)
    assert [d.status for d in graph_server.deliveries][:2] == [
        None,
        202,
    ]  # no answer in 3 s, then 202
