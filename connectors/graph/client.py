"""Graph's mail REST calls for one mailbox (the only module of this connector that imports
``httpx2``, pydantic's maintained httpx).

Every request goes through the mailbox's :class:`~connectors.graph.gate.MailboxGate` (4 in
flight at most, ``Retry-After`` honoured for the whole mailbox) and carries
``Prefer: IdType="ImmutableId"`` so message ids survive moves between folders
(learn.microsoft.com/graph/outlook-immutable-id). Answers are mapped to this package's errors:

=============================================  =================================================
401                                            the token is dropped and the call made once more;
                                               a second 401 is :class:`AccessDenied`
403, ``ErrorAccessDenied``                     :class:`AccessDenied` (consent revoked, an
                                               application access policy)
404 on the mailbox or a folder                 :class:`MailboxNotFound`
404 on a message (``$value``)                  ``None``: it was deleted since the delta page
410, ``syncStateNotFound``, ``resyncRequired``  :class:`SyncStateGone`
429, 503, 504                                  wait ``Retry-After`` (the mailbox's gate), retry up
                                               to ``max_retries`` times, then ConnectionLost
transport errors, timeouts, other 5xx          :class:`ConnectionLost`
=============================================  =================================================
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx2

from connectors.graph.auth import TokenSource
from connectors.graph.config import GraphSourceSettings
from connectors.graph.delta import SELECT, DeltaPage, parse_delta_page
from connectors.graph.errors import (
    AccessDenied,
    ConnectionLost,
    GraphProtocolError,
    MailboxNotFound,
    SyncStateGone,
)
from connectors.graph.gate import MailboxGate

log = logging.getLogger(__name__)
# httpx2 logs every URL at INFO (a delta link's token included) and httpcore2 the headers at
# DEBUG; this module logs what matters itself, without the query.
logging.getLogger("httpx2").setLevel(logging.WARNING)
logging.getLogger("httpcore2").setLevel(logging.INFO)

__all__ = ["GraphClient"]

#: Without a Retry-After, a throttled call waits this long (Graph always sends one for 429).
DEFAULT_RETRY_AFTER_S = 2.0
#: A Retry-After above this is capped: a wait that long is better spent in the worker's backoff.
MAX_RETRY_AFTER_S = 300.0
THROTTLED = frozenset({429, 503, 504})
SYNC_STATE_CODES = frozenset({"syncStateNotFound", "resyncRequired", "SyncStateNotFound"})
IMMUTABLE_IDS = 'IdType="ImmutableId"'


@functools.cache
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """One TLS context per CA file per process, shared by every mailbox's client (an
    ``SSLContext`` is safe to share between threads). Each context holds its own copy of the
    loaded CA store: one per mailbox was most of a Graph mailbox's idle memory."""
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)
    return httpx2.create_ssl_context()  # what ``verify=True`` builds, SSL_CERT_FILE honoured


class GraphClient:
    """One mailbox's calls. Thread-safe: the folder workers of a mailbox share it."""

    def __init__(
        self,
        settings: GraphSourceSettings,
        user: str,
        tokens: TokenSource,
        gate: MailboxGate,
        stop: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.user = user
        self._tokens = tokens
        self.gate = gate
        self._stop = stop
        self._root = f"{settings.api_base}/users/{quote(user, safe='@.')}"
        self._http = httpx2.Client(
            timeout=settings.request_timeout_seconds,
            verify=tls_context(settings.ca_file),
            limits=httpx2.Limits(max_connections=gate.limit, max_keepalive_connections=gate.limit),
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    # --- the calls ----------------------------------------------------------------------------

    def folder_id(self, folder: str) -> str:
        """The id of a well-known folder name (``inbox``) or of a folder id."""
        body = self._json("GET", f"{self._root}/mailFolders/{quote(folder)}", {"$select": "id"})
        folder_id = body.get("id")
        if not isinstance(folder_id, str):
            raise GraphProtocolError(f"mailFolders/{folder} answered without an id")
        return folder_id

    def delta_start(self, folder: str, received_since: str | None = None) -> str:
        """The URL of a folder's first delta round (``received_since``: an ISO instant)."""
        url = f"{self._root}/mailFolders/{quote(folder)}/messages/delta?$select={','.join(SELECT)}"
        if received_since is not None:
            url += f"&$filter=receivedDateTime+ge+{received_since}"
        return url

    def delta_page(self, url: str) -> DeltaPage:
        """One page of a delta round: a first URL, a nextLink or a deltaLink, as they are."""
        prefer = f"{IMMUTABLE_IDS}, odata.maxpagesize={self.settings.batch_size}"
        return parse_delta_page(self._json("GET", url, None, prefer=prefer))

    def mime(self, message_id: str) -> bytes | None:
        """The message's MIME (``$value``), or None when it is gone already."""
        url = f"{self._root}/messages/{quote(message_id, safe='')}/$value"
        response = self._request("GET", url, None, missing_ok=True)
        return None if response is None else response.content

    def parent_folder(self, message_id: str) -> str | None:
        """The folder a message is in now (its ``parentFolderId``), or None when it is gone.
        An immutable id stays the same across moves (outlook-immutable-id)."""
        url = f"{self._root}/messages/{quote(message_id, safe='')}"
        response = self._request("GET", url, {"$select": "parentFolderId"}, missing_ok=True)
        if response is None:
            return None
        parent = response.json().get("parentFolderId")
        return parent if isinstance(parent, str) else None

    # --- change notification subscriptions (wake-ups only) ---------------------------------------

    def subscribe(
        self, folder: str, notification_url: str, lifecycle_url: str, expires: str, state: str
    ) -> tuple[str, str]:
        """A subscription to the folder's message changes (created, updated, deleted), with
        immutable ids in its notifications; returns (id, expirationDateTime)."""
        body = self._json(
            "POST",
            f"{self.settings.api_base}/subscriptions",
            None,
            payload={
                "changeType": "created,updated,deleted",
                "notificationUrl": notification_url,
                "lifecycleNotificationUrl": lifecycle_url,
                "resource": f"users/{self.user}/mailFolders('{folder}')/messages",
                "expirationDateTime": expires,
                "clientState": state,
            },
        )
        return str(body["id"]), str(body.get("expirationDateTime", expires))

    def renew(self, subscription_id: str, expires: str) -> None:
        """A new expiry for the subscription (a renewal also reauthorizes it). A subscription
        that is gone raises MailboxNotFound (404): subscribe again."""
        url = f"{self.settings.api_base}/subscriptions/{quote(subscription_id)}"
        self._json("PATCH", url, None, payload={"expirationDateTime": expires})

    def unsubscribe(self, subscription_id: str) -> None:
        url = f"{self.settings.api_base}/subscriptions/{quote(subscription_id)}"
        self._request("DELETE", url, None, missing_ok=True)

    # --- one request ----------------------------------------------------------------------------

    def _json(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        prefer: str = IMMUTABLE_IDS,
        payload: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        response = self._request(method, url, params, prefer=prefer, payload=payload)
        assert response is not None
        try:
            body = response.json()
        except ValueError:
            raise GraphProtocolError(f"{method} {_path(url)}: not JSON") from None
        if not isinstance(body, dict):
            raise GraphProtocolError(f"{method} {_path(url)}: not a JSON object")
        return body

    def _request(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None,
        *,
        prefer: str = IMMUTABLE_IDS,
        missing_ok: bool = False,
        payload: Mapping[str, Any] | None = None,
    ) -> httpx2.Response | None:
        refused_once = False
        retries = 0
        while True:
            headers = {"Authorization": f"Bearer {self._tokens.token()}", "Prefer": prefer}
            with self.gate.slot(self._stop):
                try:
                    response = self._http.request(
                        method, url, params=params, headers=headers, json=payload
                    )
                except httpx2.HTTPError as exc:
                    raise ConnectionLost(f"{method} {_path(url)}: {type(exc).__name__}") from None
            status = response.status_code
            if status < 300:
                return response
            if status in THROTTLED:
                if retries >= self.settings.max_retries:
                    raise ConnectionLost(f"{method} {_path(url)}: {status} after {retries} retries")
                retries += 1
                wait = _retry_after(response)
                log.info(
                    "graph %s: %s %s answered %d; retry in %.1fs (the whole mailbox waits)",
                    self.user,
                    method,
                    _path(url),
                    status,
                    wait,
                )
                self.gate.hold_off(wait)
                continue
            code = _error_code(response)
            if status == 401 and not refused_once:
                refused_once = True
                self._tokens.refused()
                continue
            if status in (401, 403):
                raise AccessDenied(f"graph refused access to {self.user}: {status} {code}")
            if status == 410 or code in SYNC_STATE_CODES:
                raise SyncStateGone(f"{_path(url)}: {status} {code}")
            if status == 404:
                if missing_ok:
                    return None
                raise MailboxNotFound(f"{self.user}: {_path(url)} not found ({code})")
            if status >= 500:
                raise ConnectionLost(f"{method} {_path(url)}: {status} {code}")
            raise GraphProtocolError(f"{method} {_path(url)}: {status} {code}")


def _retry_after(response: httpx2.Response) -> float:
    value = response.headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER_S
    except ValueError:
        seconds = DEFAULT_RETRY_AFTER_S  # an HTTP date: Graph sends seconds, this is a fallback
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _error_code(response: httpx2.Response) -> str:
    """Graph's ``error.code`` (``syncStateNotFound``, ``ErrorAccessDenied``...), or ''."""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("code", "")) if isinstance(error, dict) else ""


def _path(url: str) -> str:
    """A URL without its query (a delta link's token is a credential of sorts: not logged)."""
    return url.split("?", 1)[0]
