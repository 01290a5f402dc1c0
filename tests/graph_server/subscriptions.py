"""Change-notification subscriptions of the Graph test server (Outlook messages only).

- ``POST /v1.0/subscriptions`` (https://learn.microsoft.com/en-us/graph/api/subscription-post-subscriptions):
  ``changeType`` (``created``, ``updated``, ``deleted``), ``notificationUrl``, optional
  ``lifecycleNotificationUrl``, ``resource`` (``users/{id}/messages``, ``me/messages``, or one
  folder: ``users/{id}/mailFolders('{folder}')/messages``), ``expirationDateTime`` at most
  10,080 minutes ahead for Outlook messages (subscription resource, "Subscription lifetime"),
  ``clientState`` (at most 128 characters). Both URLs are validated (``delivery.py``) before the
  ``201 Created``. ``Prefer: IdType="ImmutableId"`` on creation makes notifications carry
  immutable ids (https://learn.microsoft.com/en-us/graph/outlook-immutable-id).
- ``GET`` / ``PATCH`` (renew, which also reauthorizes) / ``DELETE`` (204)
  ``/v1.0/subscriptions/{id}``, ``GET /v1.0/subscriptions``, ``POST .../reauthorize`` (204).
- a notification per change (https://learn.microsoft.com/en-us/graph/api/resources/changenotification),
  as the webhooks page shows it: ``subscriptionId``, ``subscriptionExpirationDateTime``,
  ``clientState``, ``changeType``, ``resource``, ``tenantId``, ``resourceData`` (``@odata.type``,
  ``@odata.id``, ``@odata.etag``, ``id``).
- lifecycle notifications (https://learn.microsoft.com/en-us/graph/change-notifications-lifecycle-events):
  ``{"subscriptionId", "subscriptionExpirationDateTime", "tenantId", "clientState",
  "lifecycleEvent"}`` to ``lifecycleNotificationUrl``; ``reauthorizationRequired`` pauses
  change notifications until ``/reauthorize`` or a renewal ("Any notifications about resource
  changes that happen when the change notification delivery pauses ... are lost"),
  ``subscriptionRemoved`` deletes the subscription, ``missed`` only tells.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .auth import Principal
from .delivery import DeliveryRefused, NotificationDelivery
from .errors import GraphError
from .mailbox import Mailbox
from .preferences import prefers_immutable

if TYPE_CHECKING:
    from .server import GraphTestServer

#: Outlook message subscriptions without resource data: "10,080 minutes (under 7 days)".
MAX_MESSAGE_SUBSCRIPTION_MINUTES = 10080
CHANGE_TYPES = ("created", "updated", "deleted")
LIFECYCLE_EVENTS = ("reauthorizationRequired", "subscriptionRemoved", "missed")

_RESOURCE = re.compile(
    r"^/?(?:users/(?P<user>[^/]+)|me)/(?:mailfolders(?:\('(?P<folder>[^']+)'\)|/(?P<folder2>[^/]+))/)?messages$",
    re.IGNORECASE,
)


@dataclass
class Subscription:
    subscription_id: str
    resource: str
    change_types: tuple[str, ...]
    notification_url: str
    lifecycle_url: str | None
    client_state: str | None
    expiration: datetime
    application_id: str
    creator_id: str
    address: str
    folder_id: str | None  # None: every folder of the mailbox
    immutable: bool
    paused: bool = False  # after reauthorizationRequired, until reauthorized

    def alive(self) -> bool:
        return self.expiration > datetime.now(UTC)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.subscription_id,
            "resource": self.resource,
            "applicationId": self.application_id,
            "changeType": ",".join(self.change_types),
            "clientState": self.client_state,
            "notificationUrl": self.notification_url,
            "lifecycleNotificationUrl": self.lifecycle_url,
            "expirationDateTime": _expiration(self.expiration),
            "creatorId": self.creator_id,
            "latestSupportedTlsVersion": "v1_2",
            "includeResourceData": False,
            "encryptionCertificate": None,
            "encryptionCertificateId": None,
            "notificationQueryOptions": None,
            "notificationUrlAppId": None,
        }


class ChangeNotifications:
    """The subscriptions extension: REST endpoints, store listener, fault switches."""

    def __init__(self, server: GraphTestServer, delivery: NotificationDelivery) -> None:
        self.server = server
        self.delivery = delivery
        self.subscriptions: dict[str, Subscription] = {}
        #: Change notifications still to drop (``drop_notifications``); -1: all.
        self.drop_remaining = 0
        self.dropped: list[dict[str, Any]] = []
        server.store.listeners.append(self._on_change)

    # -- ServerExtension -------------------------------------------------------------------------

    def install(self, app: web.Application) -> None:
        return None

    async def close(self) -> None:
        await self.delivery.close()

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        mailbox: Mailbox | None,
        rest: list[str],
        principal: Principal,
    ) -> web.StreamResponse | None:
        segments = path.split("/")
        if segments[0].lower() != "subscriptions":
            return None
        return await self._subscriptions(request, segments[1:], principal)

    # -- fault switches (test thread) -------------------------------------------------------------

    def drop(self, count: int | None) -> None:
        with self.server.store.cond:
            self.drop_remaining = -1 if count is None else count

    def lifecycle(self, subscription_id: str, event: str) -> None:
        if event not in LIFECYCLE_EVENTS:
            raise ValueError(f"event must be one of {LIFECYCLE_EVENTS}")
        with self.server.store.cond:
            subscription = self.subscriptions[subscription_id]
            if subscription.lifecycle_url is None:
                raise ValueError(f"subscription {subscription_id} has no lifecycleNotificationUrl")
            notification = {
                "subscriptionId": subscription.subscription_id,
                "subscriptionExpirationDateTime": _expiration(subscription.expiration),
                "tenantId": self.server.tenant,
                "clientState": subscription.client_state,
                "lifecycleEvent": event,
            }
            if event == "reauthorizationRequired":
                subscription.paused = True
            elif event == "subscriptionRemoved":
                del self.subscriptions[subscription_id]
            url = subscription.lifecycle_url
        self.server.loop.call_soon_threadsafe(self.delivery.send, url, [notification])

    def expire(self, subscription_id: str) -> None:
        with self.server.store.cond:
            self.subscriptions.pop(subscription_id)

    # -- REST ------------------------------------------------------------------------------------

    async def _subscriptions(
        self, request: web.Request, segments: list[str], principal: Principal
    ) -> web.StreamResponse:
        context = f"{self.server.graph_url}/$metadata#subscriptions"
        if not segments and request.method == "POST":
            subscription = await self._create(request, principal)
            return web.json_response(
                {"@odata.context": f"{context}/$entity", **subscription.to_json()}, status=201
            )
        if not segments and request.method == "GET":
            with self.server.store.cond:
                value = [
                    s.to_json()
                    for s in self.subscriptions.values()
                    if s.application_id == principal.client_id and s.alive()
                ]
            return web.json_response({"@odata.context": context, "value": value})
        subscription = self._own(segments[0] if segments else "", principal)
        if segments[1:] == ["reauthorize"] and request.method == "POST":
            with self.server.store.cond:
                subscription.paused = False
            return web.Response(status=204)
        if len(segments) != 1:
            raise GraphError(
                400, "BadRequest", f"Resource not found for the segment '{'/'.join(segments)}'."
            )
        if request.method == "GET":
            return web.json_response(
                {"@odata.context": f"{context}/$entity", **subscription.to_json()}
            )
        if request.method == "DELETE":
            with self.server.store.cond:
                self.subscriptions.pop(subscription.subscription_id, None)
            return web.Response(status=204)
        if request.method == "PATCH":
            body = await _json(request)
            expiration = _parse_expiration(body.get("expirationDateTime"))
            with self.server.store.cond:
                subscription.expiration = expiration
                subscription.paused = False  # "renewing your subscription also reauthorizes"
            return web.json_response(
                {"@odata.context": f"{context}/$entity", **subscription.to_json()}
            )
        raise GraphError(405, "BadRequest", f"{request.method} is not allowed here.")

    def _own(self, subscription_id: str, principal: Principal) -> Subscription:
        with self.server.store.cond:
            subscription = self.subscriptions.get(subscription_id)
            if subscription is not None and not subscription.alive():
                del self.subscriptions[subscription_id]  # Graph deletes expired subscriptions
                subscription = None
        if subscription is None or subscription.application_id != principal.client_id:
            raise GraphError(404, "ResourceNotFound", "The object was not found.")
        return subscription

    async def _create(self, request: web.Request, principal: Principal) -> Subscription:
        body = await _json(request)
        change_types = tuple(
            c.strip() for c in str(body.get("changeType", "")).split(",") if c.strip()
        )
        if not change_types or any(c not in CHANGE_TYPES for c in change_types):
            raise GraphError(
                400,
                "InvalidRequest",
                f"changeType must be a comma-separated subset of {CHANGE_TYPES}.",
            )
        notification_url = body.get("notificationUrl")
        lifecycle_url = body.get("lifecycleNotificationUrl")
        client_state = body.get("clientState")
        if not isinstance(notification_url, str) or not notification_url:
            raise GraphError(400, "InvalidRequest", "notificationUrl is required.")
        if client_state is not None and (
            not isinstance(client_state, str) or len(client_state) > 128
        ):
            raise GraphError(
                400, "InvalidRequest", "clientState must be a string of at most 128 characters."
            )
        expiration = _parse_expiration(body.get("expirationDateTime"))
        resource = str(body.get("resource", ""))
        match = _RESOURCE.match(resource)
        if match is None:
            raise GraphError(
                400,
                "InvalidRequest",
                f"The test server models message subscriptions only (users/{{id}}/messages, "
                f"users/{{id}}/mailFolders('{{id}}')/messages); got resource {resource!r}.",
            )
        mailbox = self._mailbox(match.group("user"), principal)
        folder_ref = match.group("folder") or match.group("folder2")
        folder_id = None
        if folder_ref is not None:
            with self.server.store.cond:
                folder = mailbox.folders.get(folder_ref) or next(
                    (
                        f
                        for f in mailbox.folders.values()
                        if f.well_known_name == folder_ref.lower()
                    ),
                    None,
                )
            if folder is None:
                raise GraphError(
                    404, "ErrorItemNotFound", "The specified object was not found in the store."
                )
            folder_id = folder.folder_id
        urls = [notification_url] + ([lifecycle_url] if isinstance(lifecycle_url, str) else [])
        try:
            for url in urls:
                self.delivery.check_url(url)
            for url in urls:
                await self.delivery.validate(url)
        except DeliveryRefused as e:
            raise GraphError(400, "ValidationError", str(e)) from None
        subscription = Subscription(
            subscription_id=str(uuid.uuid4()),
            resource=resource,
            change_types=change_types,
            notification_url=notification_url,
            lifecycle_url=lifecycle_url if isinstance(lifecycle_url, str) else None,
            client_state=client_state,
            expiration=expiration,
            application_id=principal.client_id,
            creator_id=mailbox.user_id if principal.user else principal.client_id,
            address=mailbox.address.lower(),
            folder_id=folder_id,
            immutable=prefers_immutable(request),
        )
        with self.server.store.cond:
            self.subscriptions[subscription.subscription_id] = subscription
            self.server.store.cond.notify_all()
        return subscription

    def _mailbox(self, user: str | None, principal: Principal) -> Mailbox:
        mailbox, _ = self.server._route_mailbox(f"users/{user}" if user else "me", principal)
        assert mailbox is not None
        return mailbox

    # -- the store listener (under the store's lock, any thread) ---------------------------------

    def _on_change(self, mailbox: Mailbox, folder_id: str, immutable_id: str, change: str) -> None:
        message = mailbox.messages.get(immutable_id)
        by_url: dict[str, list[dict[str, Any]]] = {}
        for subscription in list(self.subscriptions.values()):
            if (
                subscription.address != mailbox.address.lower()
                or (subscription.folder_id is not None and subscription.folder_id != folder_id)
                or change not in subscription.change_types
                or not subscription.alive()
                or subscription.paused
            ):
                continue
            if subscription.immutable:
                message_id = immutable_id
            elif message is not None and message.folder_id == folder_id:
                message_id = message.rest_id
            else:
                message_id = mailbox.folders[folder_id].departed.get(immutable_id, immutable_id)
            resource = f"Users/{mailbox.user_id}/Messages/{message_id}"
            data: dict[str, Any] = {
                "@odata.type": "#Microsoft.Graph.Message",
                "@odata.id": resource,
            }
            if message is not None:
                data["@odata.etag"] = f'W/"{message.change_key}"'
            data["id"] = message_id
            notification = {
                "subscriptionId": subscription.subscription_id,
                "subscriptionExpirationDateTime": _expiration(subscription.expiration),
                "changeType": change,
                "resource": resource,
                "resourceData": data,
                "clientState": subscription.client_state,
                "tenantId": self.server.tenant,
            }
            if self.drop_remaining != 0:
                if self.drop_remaining > 0:
                    self.drop_remaining -= 1
                self.dropped.append(notification)
                continue
            by_url.setdefault(subscription.notification_url, []).append(notification)
        for url, notifications in by_url.items():
            self.server.loop.call_soon_threadsafe(self.delivery.send, url, notifications)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise GraphError(400, "BadRequest", "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise GraphError(400, "BadRequest", "The request body must be a JSON object.")
    return body


def _parse_expiration(value: object) -> datetime:
    if not isinstance(value, str):
        raise GraphError(400, "InvalidRequest", "expirationDateTime is required.")
    try:
        expiration = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise GraphError(
            400, "InvalidRequest", f"expirationDateTime {value!r} is not a date."
        ) from None
    if expiration.tzinfo is None:
        expiration = expiration.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    if expiration <= now:
        raise GraphError(400, "InvalidRequest", "Subscription expiration must be in the future.")
    if expiration > now + timedelta(minutes=MAX_MESSAGE_SUBSCRIPTION_MINUTES):
        raise GraphError(
            400,
            "InvalidRequest",
            f"Subscription expiration can only be {MAX_MESSAGE_SUBSCRIPTION_MINUTES} minutes in the future.",
        )
    return expiration


def _expiration(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")
