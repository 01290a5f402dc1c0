"""How the Graph test server delivers change notifications: webhooks and Azure Event Hubs.

Webhooks (https://learn.microsoft.com/en-us/graph/change-notifications-delivery-webhooks):

- the validation handshake: ``POST {url}?validationToken={token}`` with ``Content-Type:
  text/plain; charset=utf-8``; the endpoint must answer ``200``, ``text/plain``, the decoded
  token, within 10 seconds, or the subscription is not created;
- a notification is a ``POST`` of a ``changeNotificationCollection`` (``{"value": [...]}``);
  a 2xx within 3 seconds is success; otherwise Graph "tries to resend the change notification
  multiple times, for up to 4 hours" and then discards it. Here the window is
  ``retry_window`` seconds (test time) with a doubling back-off from ``retry_initial``.

Azure Event Hubs (https://learn.microsoft.com/en-us/graph/change-notifications-delivery-event-hubs):
``notificationUrl`` = ``EventHub:https://<namespace>.servicebus.windows.net/eventhubname/<hub>?tenantId=<domain>``.
Event Hubs speaks the Kafka protocol (https://learn.microsoft.com/en-us/azure/event-hubs/azure-event-hubs-kafka-overview:
a namespace is a Kafka cluster, an event hub is a topic), so the test server models a namespace
with the test session's Kafka broker (``event_hubs_bootstrap``) and produces each
notification collection's JSON to the topic named like the hub. A new subscription first gets
the documented validation message (``"subscriptionId": "NA"``, ``"changeType": "Validation:
Testing client application reachability ..."``), which receivers must ignore.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

log = logging.getLogger(__name__)

#: "If Microsoft Graph doesn't receive a 2xx class code within 3 seconds, it tries to resend".
WEBHOOK_TIMEOUT = 3.0
#: "The client must respond ... within 10 seconds" (notificationUrl validation).
VALIDATION_TIMEOUT = 10.0
EVENT_HUB_PREFIX = "EventHub:"


@dataclass
class Delivery:
    """One delivery attempt, for tests to read (``GraphTestServer.deliveries``)."""

    target: str
    payload: dict[str, Any]
    attempt: int
    status: int | None  # HTTP status; 0 for a produced Kafka record; None: no answer
    error: str | None = None
    at: float = field(default_factory=time.monotonic)


class DeliveryRefused(Exception):
    """A subscription cannot be created: its URL cannot be validated or reached."""


@dataclass(frozen=True)
class EventHubTarget:
    namespace: str
    hub: str


def event_hub_target(url: str) -> EventHubTarget | None:
    """``EventHub:https://ns.servicebus.windows.net/eventhubname/hub?tenantId=x`` -> target;
    None for a webhook URL. Raises ``DeliveryRefused`` for an Event Hubs URL of another form."""
    if not url.startswith(EVENT_HUB_PREFIX):
        return None
    parts = urlsplit(url[len(EVENT_HUB_PREFIX) :])
    segments = [s for s in parts.path.split("/") if s]
    if (
        parts.scheme != "https"
        or not (parts.hostname or "").endswith(".servicebus.windows.net")
        or len(segments) != 2
        or segments[0] != "eventhubname"
        or "tenantId=" not in parts.query
    ):
        raise DeliveryRefused(
            "The Event Hubs notificationUrl must be EventHub:https://<namespace>.servicebus."
            "windows.net/eventhubname/<hub>?tenantId=<domain> (the test server models the "
            f"RBAC form only); got {url!r}."
        )
    return EventHubTarget((parts.hostname or "").split(".")[0], segments[1])


class NotificationDelivery:
    """Sends validation requests and notification collections; runs on the server's loop."""

    def __init__(
        self,
        *,
        trust: list[Path],
        event_hubs_bootstrap: str | None,
        retry_initial: float,
        retry_window: float,
        allow_http: bool,
    ) -> None:
        # Only the given CAs (not the system store: webhooks of tests live on loopback, and
        # loading the system bundle costs ~0.3 s per server).
        self._ssl = ssl.create_default_context(cafile=str(trust[0]))
        for ca in trust[1:]:
            self._ssl.load_verify_locations(cafile=str(ca))
        self.event_hubs_bootstrap = event_hubs_bootstrap
        self.retry_initial = retry_initial
        self.retry_window = retry_window
        self.allow_http = allow_http
        self.deliveries: list[Delivery] = []
        self._session: aiohttp.ClientSession | None = None
        self._producer: Any = None
        self._queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self.on_delivery: Any = None  # called (under no lock) after every attempt

    async def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._producer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._producer.flush, 10)
            self._producer = None  # librdkafka's threads end with the last reference

    # -- subscription time -----------------------------------------------------------------------

    def check_url(self, url: str) -> None:
        """Refuse a URL Graph would refuse before it sends anything."""
        if event_hub_target(url) is not None:
            if self.event_hubs_bootstrap is None:
                raise DeliveryRefused(
                    "Event Hubs delivery needs a broker: start the test server with "
                    "GraphTestServer(event_hubs_bootstrap='host:port')."
                )
            return
        scheme = urlsplit(url).scheme
        if scheme != "https" and not (scheme == "http" and self.allow_http):
            raise DeliveryRefused(
                f"The notification URL must use HTTPS (got {url!r}); the test server allows "
                "http only with GraphTestServer(allow_http_webhooks=True)."
            )

    async def validate(self, url: str) -> None:
        """The validation handshake (webhooks) or the validation message (Event Hubs)."""
        target = event_hub_target(url)
        if target is not None:
            request_id = str(uuid.uuid4())
            message = {
                "value": [
                    {
                        "subscriptionId": "NA",
                        "subscriptionExpirationDateTime": "NA",
                        "clientState": "NA",
                        "changeType": "Validation: Testing client application reachability "
                        f"for subscription Request-Id: {request_id}",
                        "resource": "NA",
                        "resourceData": {"@odata.type": "NA", "@odata.id": "NA", "id": "NA"},
                    }
                ]
            }
            await self._require_hub(target)
            await self._produce(target, message, attempt=1)
            return
        token = f"Validation: Testing client application reachability for subscription Request-Id: {uuid.uuid4()}"
        session = self._client()
        try:
            async with session.post(
                url,
                params={"validationToken": token},
                headers={"Content-Type": "text/plain; charset=utf-8"},
                timeout=aiohttp.ClientTimeout(total=VALIDATION_TIMEOUT),
                ssl=self._ssl,
            ) as response:
                body = await response.text()
                content_type = response.headers.get("Content-Type", "")
                ok = (
                    response.status == 200
                    and content_type.startswith("text/plain")
                    and body == token
                )
        except (aiohttp.ClientError, TimeoutError) as e:
            raise DeliveryRefused(f"Subscription validation request failed: {e!r}.") from e
        if not ok:
            raise DeliveryRefused(
                "Subscription validation request failed. Notification endpoint must respond "
                "with 200 OK to validation request."
            )

    # -- notification time -----------------------------------------------------------------------

    def send(self, url: str, notifications: list[dict[str, Any]]) -> None:
        """Queue notifications for ``url``; one worker per URL keeps their order."""
        queue = self._queues.get(url)
        if queue is None:
            queue = asyncio.Queue()
            self._queues[url] = queue
            self._workers.append(asyncio.ensure_future(self._worker(url, queue)))
        for notification in notifications:
            queue.put_nowait(notification)

    async def _worker(self, url: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            batch = [await queue.get()]
            while not queue.empty():  # what piled up goes in one POST, as Graph batches
                batch.append(queue.get_nowait())
            await self._deliver(url, {"value": batch})

    async def _deliver(self, url: str, payload: dict[str, Any]) -> None:
        target = event_hub_target(url)
        deadline = time.monotonic() + self.retry_window
        delay = self.retry_initial
        attempt = 0
        while True:
            attempt += 1
            if target is not None:
                ok = await self._produce(target, payload, attempt)
            else:
                ok = await self._post(url, payload, attempt)
            if ok:
                return
            if time.monotonic() + delay > deadline:
                log.info(
                    "graph-server: notification to %s discarded after %d attempts", url, attempt
                )
                return
            await asyncio.sleep(delay)
            delay *= 2

    async def _post(self, url: str, payload: dict[str, Any], attempt: int) -> bool:
        status: int | None = None
        error: str | None = None
        try:
            async with self._client().post(
                url,
                json=payload,
                timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT),
                ssl=self._ssl,
            ) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            error = repr(e)
        self._record(Delivery(url, payload, attempt, status, error))
        return status is not None and 200 <= status < 300

    async def _produce(self, target: EventHubTarget, payload: dict[str, Any], attempt: int) -> bool:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str | None] = loop.create_future()

        def settle(result: str | None) -> None:
            if not done.done():
                done.set_result(result)

        def on_delivery(err: Any, _msg: Any) -> None:
            loop.call_soon_threadsafe(settle, None if err is None else str(err))

        producer = await self._kafka()
        producer.produce(target.hub, json.dumps(payload).encode(), on_delivery=on_delivery)
        poller = loop.run_in_executor(None, producer.flush, 30)
        error = await done
        await poller
        url = f"EventHub:{target.namespace}/{target.hub}"
        self._record(Delivery(url, payload, attempt, 0 if error is None else None, error))
        return error is None

    async def _require_hub(self, target: EventHubTarget) -> None:
        producer = await self._kafka()
        metadata = await asyncio.get_running_loop().run_in_executor(
            None, lambda: producer.list_topics(target.hub, timeout=10)
        )
        topic = metadata.topics.get(target.hub)
        if topic is None or topic.error is not None:
            raise DeliveryRefused(
                f"The event hub {target.hub!r} does not exist in namespace {target.namespace!r} "
                f"(no Kafka topic {target.hub!r} on {self.event_hubs_bootstrap})."
            )

    async def _kafka(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            assert self.event_hubs_bootstrap is not None
            # Graph's sender is an Event Hubs client with its own retries; acks=all mirrors
            # "the event is stored" before Graph considers it delivered.
            self._producer = Producer(
                {
                    "bootstrap.servers": self.event_hubs_bootstrap,
                    "acks": "all",
                    "message.timeout.ms": 20000,
                }
            )
        return self._producer

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    def _record(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)
        if self.on_delivery is not None:
            self.on_delivery()
