"""The EWS wire, behind our own small interface. The ONLY module that imports exchangelib.

Everything above this module speaks in :class:`ItemRef` and :class:`FetchedItem`,
and sees four kinds of failure: :class:`ConnectionLost` (retry),
:class:`SubscriptionGone` (subscribe again, catch up), ``AuthenticationError`` and ``ConfigError``
(permanent: bad credentials, untrusted certificate).

Requests this module makes (exchangelib 5.6, Exchange2016 dialect)::

    ConvertId (version guess) -> GetFolder root -> GetFolder <folder>        open()
    Subscribe <m:StreamingSubscriptionRequest>                               subscribe()
    GetStreamingEvents <m:ConnectionTimeout>N</m:ConnectionTimeout>          stream()
    GetItem item:MimeContent item:DateTimeReceived message:IsRead           fetch()
            item:Categories, extended property 0x1090 (PidTagFlagStatus)
    FindItem item:DateTimeReceived >= since, ascending, one page             find_since()
    FindItem IdOnly + DateTimeReceived, the whole folder, by pages           list_folder()
    FindItem over every watched folder: InternetMessageId = <id>             holders()
             OR DateTimeReceived in [t, t + 1 s)

Pitfalls handled here (PITFALLS.md, exchangelib 5.6):

- the stream holds one HTTP connection for its whole duration: ``max_connections`` >= 2, or a
  GetItem inside the stream loop waits forever for a session (#906, #1088);
- the ``get_streaming_events`` generator is always consumed or closed, and the streaming
  session released (``stop_streaming``), or the session leaks;
- exchangelib reads the stream with a timeout of ConnectionTimeout + 1 minute; we set our own read
  timeout so that a stalled stream is noticed (``stream_read_timeout_seconds``);
- errors mid-stream come from ``requests``, not from exchangelib: they are connection losses;
- the default retry policy is fail-fast, which we keep: backoff is the source's job.

``SyncFolderItems`` is never used: streaming and sync states must not be mixed (DESIGN.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import logging
import socket
import ssl
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from exchangelib import (
    BASIC,
    DELEGATE,
    IMPERSONATION,
    NTLM,
    OAUTH2,
    Account,
    Configuration,
    Credentials,
    EWSDateTime,
    EWSTimeZone,
    Identity,
    OAuth2AuthorizationCodeCredentials,
    OAuth2Credentials,
    Q,
)
from exchangelib import errors as ews_errors
from exchangelib.extended_properties import ExtendedProperty
from exchangelib.folders import BaseFolder
from exchangelib.items import Message
from exchangelib.protocol import BaseProtocol
from exchangelib.services import GetStreamingEvents

from connectors.core.redact import quiet_token_libraries, redact_headers
from connectors.ews.config import EwsAccountSettings, EwsSourceSettings
from connectors.ews.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionLost,
    EwsProtocolError,
    SubscriptionGone,
)

log = logging.getLogger(__name__)

# exchangelib logs request headers (the Authorization header) at DEBUG and on errors, and its
# OAuth2 flow goes through requests-oauthlib, which logs tokens at DEBUG.
redact_headers("exchangelib.util")
quiet_token_libraries()

#: The item events we subscribe to. Moved/Copied are arrivals when their ParentFolderId is the
#: watched folder; a move *out* of it (OldParentFolderId) is reported to its subscription too.
EVENT_TYPES = (
    "NewMailEvent",
    "CreatedEvent",
    "MovedEvent",
    "CopiedEvent",
    "ModifiedEvent",
    "DeletedEvent",
)
_ARRIVALS = ("NewMailEvent", "CreatedEvent")
#: interrupt() waits at most this long for a stream that is starting to have its socket.
INTERRUPT_WAIT_S = 2.0
#: GetItem properties: the MIME for the shared parser, the receive time for the watermark, and the
#: read state (published as the \\Seen flag, like the IMAP source does).
_FETCH_FIELDS = ["mime_content", "datetime_received", "is_read", "categories", "flag_status"]


class FlagStatus(ExtendedProperty):  # type: ignore[misc]  # exchangelib is untyped
    """``PidTagFlagStatus`` (0x1090), Outlook's follow-up flag: 2 flagged, 1 complete.
    exchangelib 5.6 has no field for it (``Flag`` is Exchange 2013+ and not in its models)."""

    property_tag = 0x1090
    property_type = "Integer"


FLAGGED = 2
if "flag_status" not in {f.name for f in Message.FIELDS}:  # a re-import must not register twice
    Message.register("flag_status", FlagStatus)

#: The Account attribute of each distinguished folder name we accept in the config.
_FOLDER_ATTRIBUTES = {
    "inbox": "inbox",
    "junkemail": "junk",
    "sentitems": "sent",
    "deleteditems": "trash",
    "drafts": "drafts",
}

_SUBSCRIPTION_GONE = (
    ews_errors.ErrorSubscriptionNotFound,
    ews_errors.ErrorExpiredSubscription,
    ews_errors.ErrorInvalidSubscription,
    ews_errors.ErrorSubscriptionUnsubsribed,  # sic, exchangelib's spelling
)
_AUTH_FAILURES = (
    ews_errors.UnauthorizedError,
    ews_errors.ErrorAccessDenied,
    ews_errors.ErrorNonExistentMailbox,
    ews_errors.ErrorImpersonateUserDenied,
)
_TRANSIENT = (
    requests.exceptions.RequestException,
    OSError,
    ews_errors.ErrorServerBusy,
    ews_errors.ErrorInternalServerTransientError,
    ews_errors.ErrorInternalServerError,
    ews_errors.ErrorTimeoutExpired,
    ews_errors.ErrorNewEventStreamConnectionOpened,
    ews_errors.ErrorMailboxStoreUnavailable,
    ews_errors.ErrorMailboxMoveInProgress,
    ews_errors.RateLimitError,
    ews_errors.MalformedResponseError,
    ews_errors.SOAPError,
    ews_errors.CASError,
)


@dataclass(frozen=True)
class ItemRef:
    """An item of the watched folder; ``received`` is known when it came from FindItem."""

    item_id: str
    change_key: str
    received: dt.datetime | None = None


@dataclass(frozen=True)
class FetchedItem:
    item_id: str
    change_key: str
    mime: bytes
    received: dt.datetime
    is_read: bool = False
    categories: tuple[str, ...] = ()
    flagged: bool = False


class ChangeKind(enum.Enum):
    ARRIVED = "arrived"  # new mail, created, or moved/copied into the watched folder
    MODIFIED = "modified"  # read state, categories ... changed (a new ChangeKey)
    GONE = "gone"  # deleted, or moved out of the watched folder


@dataclass(frozen=True)
class Change:
    """What one streaming event says about an item of the watched folder.

    ``other_folder`` is the watched folder (configured name) at the other end of a move or copy:
    where an ARRIVED item came from, where a GONE item went; ``None`` when that end is no
    watched folder of the account (or for new mail, modifications and deletions).
    """

    kind: ChangeKind
    item_id: str
    change_key: str
    other_folder: str | None = None


class EwsConnection:
    """One mailbox folder over EWS. Not thread-safe: one worker thread owns it."""

    def __init__(
        self, account: EwsAccountSettings, settings: EwsSourceSettings, folder: str
    ) -> None:
        self._settings = settings
        self._account_settings = account
        self._folder_name = folder
        self._account: Account | None = None
        self._folder: BaseFolder | None = None
        #: folder id -> configured name, for every watched folder of the account (this one too).
        self._watched: dict[str, str] = {}
        self._streaming: GetStreamingEvents | None = None
        self._interrupted = False

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        """Resolve the folder (GetFolder); proves the endpoint, TLS and credentials work."""
        with _translated(self._account_settings.service_endpoint):
            _trust_ca_file(self._account_settings)
            account = Account(
                primary_smtp_address=self._account_settings.email,
                config=self._configuration(),
                autodiscover=False,
                access_type=self._access_type(),
            )
            # Every request but the stream uses this timeout (exchangelib's default is 120 s).
            account.protocol.TIMEOUT = self._settings.request_timeout_seconds
            folder = getattr(account, _FOLDER_ATTRIBUTES[self._folder_name])
            # The other watched folders of the account, to tell a move between watched folders
            # (an UPDATED event in the target) from a move out of all of them (tombstone check).
            watched = {
                getattr(account, _FOLDER_ATTRIBUTES[name]).id: name
                for name in self._account_settings.folders
            }
        self._account, self._folder, self._watched = account, folder, watched
        log.info(
            "ews connected",
            extra={"account": self._account_settings.name, "folder": self._folder_name},
        )

    def close(self) -> None:
        if self._account is not None:
            try:
                self._account.protocol.close()
            except Exception as exc:  # closing a broken pool must not mask the original error
                log.debug("closing EWS sessions failed: %s", exc)
        self._account = self._folder = None

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self) -> str:
        folder = self._require_folder()
        with _translated(self._account_settings.service_endpoint):
            subscription_id: str = folder.subscribe_to_streaming(event_types=EVENT_TYPES)
        return subscription_id

    def stream(self, subscription_id: str) -> Generator[list[Change], None, None]:
        """Yield the item changes of each notification until the server closes the stream.

        Yields possibly empty lists (a notification about the folder itself). Returns when the
        server ends with ConnectionStatus=Closed; a stream that ends otherwise raises
        :class:`ConnectionLost`. The subscription is never unsubscribed: the next stream, of this
        process or of the next one, reconnects to it while it lives.
        """
        folder = self._require_folder()
        svc = GetStreamingEvents(account=self._require_account())
        notifications = svc.call(
            subscription_ids=[subscription_id],
            connection_timeout=self._settings.connection_timeout_minutes,
        )
        # call() set svc.timeout to ConnectionTimeout + 1 min; the request is sent lazily on the
        # first next(), so this is the read timeout requests applies to the stream.
        svc.timeout = self._settings.stream_read_timeout_seconds
        self._streaming = svc
        if self._interrupted:  # interrupt() may have looked before _streaming was set
            self._streaming = None
            raise ConnectionLost("interrupted")
        try:
            while True:
                with _translated(self._account_settings.service_endpoint):
                    notification = next(notifications, None)
                if notification is None:
                    break
                yield _changes(notification, folder.id, self._watched)
        finally:
            self._streaming = None
            notifications.close()
            if svc.streaming:
                svc.stop_streaming()
        if svc.connection_status != GetStreamingEvents.CLOSED:
            raise ConnectionLost("the event stream ended without ConnectionStatus=Closed")

    def interrupt(self, wait: float = INTERRUPT_WAIT_S) -> None:
        """From another thread: end a blocked stream read now (a stop was requested).

        exchangelib does not yield keep-alives, so a quiet stream blocks its reader until the next
        notification or ConnectionStatus=Closed; shutting the socket down ends the read at once
        (the reader sees a :class:`ConnectionLost`). A stream that is about to start sees the flag
        and does not start. exchangelib keeps the response in a private attribute; if that ever
        changes, this does nothing and the reader ends at its read timeout.
        """
        self._interrupted = True
        deadline = time.monotonic() + wait
        while (svc := self._streaming) is not None:
            # The response exists once the server's headers are in; until then, wait a little.
            response = getattr(svc, "_streaming_response", None)
            sock = getattr(
                getattr(getattr(response, "raw", None), "connection", None), "sock", None
            )
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                return
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)

    # -- items -------------------------------------------------------------------------------

    def find_since(self, since: dt.datetime, limit: int) -> list[ItemRef]:
        """The first ``limit`` items with DateTimeReceived >= ``since``, oldest first: one
        FindItem page. Callers page by moving ``since`` (keyset paging), not by offset: an offset
        page skips an item when an earlier one is deleted between two pages."""
        folder = self._require_folder()
        ews_since = EWSDateTime.fromtimestamp(since.timestamp(), tz=EWSTimeZone("UTC"))
        query = (
            folder.filter(datetime_received__gte=ews_since)
            .only("id", "changekey", "datetime_received")
            .order_by("datetime_received")
        )
        query.page_size = limit
        with _translated(self._account_settings.service_endpoint):
            items = list(query[:limit])
        return [ItemRef(i.id, i.changekey, _to_utc(i.datetime_received)) for i in items]

    def list_folder(self, page: int) -> Generator[ItemRef, None, None]:
        """Every item of the folder (id, ChangeKey, DateTimeReceived), oldest first, ``page``
        per FindItem: what a reconciliation compares with what was published."""
        folder = self._require_folder()
        query = (
            folder.all().only("id", "changekey", "datetime_received").order_by("datetime_received")
        )
        query.page_size = page
        with _translated(self._account_settings.service_endpoint):
            for item in query:
                if isinstance(item, Exception):
                    raise EwsProtocolError(f"FindItem failed: {type(item).__name__}: {item}")
                yield ItemRef(item.id, item.changekey, _to_utc(item.datetime_received))

    def holders(self, message_id: str | None, received: dt.datetime) -> list[FetchedItem]:
        """The items of every watched folder of the account that may be the mail with this
        Message-ID (normalized, without brackets) or this DateTimeReceived (whole second),
        fetched with their MIME so the caller can compare keys. A move or a copy keeps the
        receive time, so a mail without a usable Message-ID is found by it too."""
        start = EWSDateTime.fromtimestamp(int(received.timestamp()), tz=EWSTimeZone("UTC"))
        query = Q(
            datetime_received__gte=start, datetime_received__lt=start + dt.timedelta(seconds=1)
        )
        if message_id is not None:
            query = query | Q(message_id=f"<{message_id}>")
        # One FindItem per folder: what one request over several ParentFolderIds answers
        # differs between servers (one result set, or one response message per folder).
        found = []
        with _translated(self._account_settings.service_endpoint):
            for folder in self._watched_folders():
                found += [
                    i
                    for i in folder.filter(query).only("id", "changekey")
                    if not isinstance(i, Exception)
                ]
        refs = [ItemRef(i.id, i.changekey) for i in found]
        return [f for f in self.fetch(refs) if f is not None] if refs else []

    def fetch(self, refs: Sequence[ItemRef]) -> list[FetchedItem | None]:
        """MIME and DateTimeReceived of each ref (GetItem); ``None`` where the item is gone."""
        account = self._require_account()
        ids = [(ref.item_id, ref.change_key) for ref in refs]
        with _translated(self._account_settings.service_endpoint):
            answers = list(account.fetch(ids=ids, only_fields=_FETCH_FIELDS))
        fetched: list[FetchedItem | None] = []
        for ref, answer in zip(refs, answers, strict=True):
            if isinstance(answer, ews_errors.ErrorItemNotFound):
                log.info("item deleted before it was read", extra={"item_id": ref.item_id})
                fetched.append(None)
            elif isinstance(answer, Exception):
                raise EwsProtocolError(f"GetItem failed: {type(answer).__name__}: {answer}")
            else:
                fetched.append(
                    FetchedItem(
                        item_id=answer.id,
                        change_key=answer.changekey,
                        mime=bytes(answer.mime_content or b""),
                        received=_to_utc(answer.datetime_received),
                        is_read=bool(getattr(answer, "is_read", False)),
                        categories=tuple(getattr(answer, "categories", None) or ()),
                        flagged=getattr(answer, "flag_status", None) == FLAGGED,
                    )
                )
        return fetched

    # -- helpers -----------------------------------------------------------------------------

    def _require_account(self) -> Account:
        if self._account is None:
            raise ConnectionLost("not connected")
        return self._account

    def _watched_folders(self) -> list[BaseFolder]:
        account = self._require_account()
        return [
            getattr(account, _FOLDER_ATTRIBUTES[name]) for name in self._account_settings.folders
        ]

    def _require_folder(self) -> BaseFolder:
        if self._folder is None:
            raise ConnectionLost("not connected")
        return self._folder

    def _access_type(self) -> str:
        # App-only OAuth tokens (client credentials) act on a mailbox through impersonation.
        return str(IMPERSONATION if self._account_settings.oauth2_client_id else DELEGATE)

    def _configuration(self) -> Configuration:
        a = self._account_settings
        credentials: Any
        if a.auth == "oauth2" and a.oauth2_access_token is not None:
            token = {
                "access_token": a.oauth2_access_token.get_secret_value(),
                "token_type": "Bearer",
            }
            credentials = OAuth2AuthorizationCodeCredentials(access_token=token)
        elif a.auth == "oauth2":
            assert a.oauth2_client_secret is not None  # validated by the settings
            credentials = OAuth2Credentials(
                client_id=a.oauth2_client_id,
                client_secret=a.oauth2_client_secret.get_secret_value(),
                tenant_id=a.oauth2_tenant_id,
                identity=Identity(primary_smtp_address=a.email),
            )
        else:
            assert a.password is not None  # validated by the settings
            credentials = Credentials(a.login, a.password.get_secret_value())
        return Configuration(
            service_endpoint=a.service_endpoint,
            credentials=credentials,
            auth_type={"ntlm": NTLM, "basic": BASIC, "oauth2": OAUTH2}[a.auth],
            max_connections=self._settings.max_connections,
        )


def _arrivals(notification: Any, folder_id: str) -> list[ItemRef]:
    """The items a notification puts into the folder (one ref per item id)."""
    refs: dict[str, ItemRef] = {}
    for change in _changes(notification, folder_id, {}):
        if change.kind is ChangeKind.ARRIVED:
            refs.setdefault(change.item_id, ItemRef(change.item_id, change.change_key))
    return list(refs.values())


def _changes(notification: Any, folder_id: str, watched: dict[str, str]) -> list[Change]:
    """The item changes of one notification for the folder ``folder_id``, in event order.

    ``watched`` maps the folder ids of the account's watched folders to their names. Folder
    events (a ``ModifiedEvent`` with ``FolderId`` and ``UnreadCount``) are not item changes.
    NewMailEvent and CreatedEvent name the same new item: it arrives once.
    """
    changes: list[Change] = []
    arrived: set[str] = set()
    for event in notification.events:
        kind = type(event).__name__
        item_id = getattr(event, "item_id", None)
        if item_id is None or kind not in EVENT_TYPES:
            continue
        parent = getattr(event, "parent_folder_id", None)
        parent_id = parent.id if parent is not None else None
        if kind in _ARRIVALS:
            if item_id.id not in arrived:
                arrived.add(item_id.id)
                changes.append(Change(ChangeKind.ARRIVED, item_id.id, item_id.changekey))
            continue
        if kind == "ModifiedEvent":
            if parent_id == folder_id:
                changes.append(Change(ChangeKind.MODIFIED, item_id.id, item_id.changekey))
            continue
        if kind == "DeletedEvent":
            if parent_id == folder_id:
                changes.append(Change(ChangeKind.GONE, item_id.id, item_id.changekey))
            continue
        # MovedEvent / CopiedEvent: ItemId + ParentFolderId is the item now, OldItemId +
        # OldParentFolderId where it was (the original, for a copy).
        old_parent = getattr(event, "old_parent_folder_id", None)
        old_parent_id = old_parent.id if old_parent is not None else None
        old_item = getattr(event, "old_item_id", None)
        if parent_id == folder_id and item_id.id not in arrived:
            arrived.add(item_id.id)
            origin = watched.get(old_parent_id) if old_parent_id is not None else None
            changes.append(Change(ChangeKind.ARRIVED, item_id.id, item_id.changekey, origin))
        if (
            kind == "MovedEvent"
            and old_parent_id == folder_id
            and parent_id != folder_id
            and old_item is not None
        ):
            target = watched.get(parent_id) if parent_id is not None else None
            changes.append(Change(ChangeKind.GONE, old_item.id, old_item.changekey, target))
    return changes


def _to_utc(value: Any) -> dt.datetime:
    return dt.datetime.fromtimestamp(value.timestamp(), dt.UTC)


class _translated:
    """Context manager: exchangelib/requests exceptions -> this package's errors."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, _OURS):
            return
        raise translate(exc, self._endpoint) from exc


def translate(exc: Exception, endpoint: str = "") -> Exception:
    """Map an exchangelib or requests exception to ours (exported for the unit tests)."""
    if _tls_failure(exc):
        return ConfigError(
            f"TLS certificate verification of {endpoint} failed ({exc}); set ca_file to the CA "
            f"that signed the Exchange server's certificate"
        )
    if isinstance(exc, _SUBSCRIPTION_GONE):
        return SubscriptionGone(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, _AUTH_FAILURES):
        return AuthenticationError(f"{endpoint}: {type(exc).__name__}: {exc}")
    # Every EWS response code is a TransportError subclass; the bare class is what exchangelib
    # raises for transport-level trouble (it wraps TLS errors in it too, handled above).
    if isinstance(exc, _TRANSIENT) or type(exc) is ews_errors.TransportError:
        return ConnectionLost(f"{type(exc).__name__}: {exc}")
    return EwsProtocolError(f"{type(exc).__name__}: {exc}")


_OURS = (ConnectionLost, SubscriptionGone, EwsProtocolError, AuthenticationError, ConfigError)


def _tls_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (requests.exceptions.SSLError, ssl.SSLCertVerificationError)):
            return True
        current = current.__cause__ or current.__context__
    return False


class _CaFileAdapter(requests.adapters.HTTPAdapter):
    """Verifies against a configured CA bundle per endpoint host; verification is never off."""

    ca_files: dict[str, str] = {}

    def send(  # type: ignore[override]  # requests passes these as keywords
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        host = urlsplit(request.url or "").hostname or ""
        # ``verify`` is True or requests' REQUESTS_CA_BUNDLE path here; False is never set.
        if kwargs.get("verify") is not False and host in self.ca_files:
            kwargs["verify"] = self.ca_files[host]
        return super().send(request, **kwargs)


def _trust_ca_file(account: EwsAccountSettings) -> None:
    """exchangelib builds its sessions itself; its adapter class is the one hook for a CA file."""
    if account.ca_file is None:
        return
    host = urlsplit(account.service_endpoint).hostname or ""
    _CaFileAdapter.ca_files[host] = account.ca_file
    BaseProtocol.HTTP_ADAPTER_CLS = _CaFileAdapter
