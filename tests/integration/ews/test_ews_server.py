"""The EWS test server against unmodified exchangelib 5.6: operations, streaming and faults."""

from __future__ import annotations

import threading
from datetime import UTC as DT_UTC
from datetime import datetime, timedelta

import pytest
import requests
from exchangelib import BASIC, DELEGATE, UTC, Account, Build, Configuration, Credentials, Version
from exchangelib.errors import (
    ErrorInvalidOperation,
    ErrorItemNotFound,
    ErrorNewEventStreamConnectionOpened,
    ErrorServerBusy,
    ErrorSubscriptionNotFound,
    UnauthorizedError,
)
from exchangelib.ewsdatetime import EWSDateTime
from exchangelib.services import GetStreamingEvents, SyncFolderItems

from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import PASSWORD, USER, fast_server
from tests.ews_server.mailbox import Event
from tests.ews_server.server import _notifications_envelope

pytestmark = pytest.mark.integration


def mime(n: int, subject: str = "hello") -> bytes:
    return (
        f"From: Alice <alice@example.org>\r\nTo: {USER}\r\nSubject: {subject} {n}\r\n"
        f"Message-ID: <msg-{n}@example.org>\r\nDate: Sun, 29 Nov 2026 16:00:00 +0000\r\n"
        f"\r\nbody {n}\r\n"
    ).encode()


def make_account(ews: EwsTestServer, password: str = PASSWORD) -> Account:
    config = Configuration(
        service_endpoint=ews.url,
        credentials=Credentials(USER, password),
        auth_type=BASIC,
        version=Version(build=Build(15, 1, 2507, 6)),
        max_connections=3,
    )
    return Account(USER, config=config, autodiscover=False, access_type=DELEGATE)


def stream(account: Account, sub_id: str, minutes: int = 1) -> list[tuple[str, str | None]]:
    """All (event type, item id) pairs of one GetStreamingEvents connection, read to its end."""
    return [
        (type(event).__name__, event.item_id.id if event.item_id else None)
        for notification in account.inbox.get_streaming_events(sub_id, connection_timeout=minutes)
        for event in notification.events
    ]


def test_inbox_is_resolved_with_get_folder(ews: EwsTestServer) -> None:
    account = make_account(ews)
    inbox = account.inbox
    assert inbox.name == "Inbox"
    assert inbox.id == ews.store.mailbox(USER).distinguished_folder("inbox").folder_id
    # exchangelib resolves root first, then the distinguished inbox; no version guessing.
    assert ews.operations() == ["GetFolder", "GetFolder"]


def test_version_is_guessed_with_convert_id(ews: EwsTestServer) -> None:
    config = Configuration(
        service_endpoint=ews.url, credentials=Credentials(USER, PASSWORD), auth_type=BASIC
    )
    account = Account(USER, config=config, autodiscover=False, access_type=DELEGATE)
    assert account.version.build == Build(15, 1, 2507, 6)
    assert account.version.api_version == "Exchange2016"
    assert ews.operations() == ["ConvertId"]


def test_streaming_sees_new_mail_and_get_returns_mime(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    first = ews.deliver(USER, mime(1))
    timer = threading.Timer(0.3, ews.deliver, args=(USER, mime(2)))
    timer.start()
    events = stream(account, sub_id)
    timer.join()

    new_mail = [item_id for kind, item_id in events if kind == "NewMailEvent"]
    assert new_mail[0] == first.item_id
    assert len(new_mail) == 2
    assert ("CreatedEvent", first.item_id) in events
    assert ("ModifiedEvent", None) in events  # the folder's unread count changed

    item = account.inbox.get(id=first.item_id, changekey=first.change_key)
    assert item.mime_content == mime(1)
    assert item.subject == "hello 1"
    assert item.message_id == "<msg-1@example.org>"
    assert item.datetime_received == first.received
    assert item.author.email_address == "alice@example.org"


def test_stream_ends_with_connection_status_closed(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    svc = GetStreamingEvents(account=account)
    assert list(svc.call(subscription_ids=[sub_id], connection_timeout=1)) == []
    assert svc.connection_status == GetStreamingEvents.CLOSED
    assert ews.open_streams() == 0


def test_events_queue_while_no_stream_is_open(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming(event_types=["NewMailEvent"])
    items = [ews.deliver(USER, mime(n)) for n in range(3)]
    assert stream(account, sub_id) == [("NewMailEvent", i.item_id) for i in items]
    assert stream(account, sub_id) == []


def test_find_item_filters_on_datetime_received(ews: EwsTestServer) -> None:
    account = make_account(ews)
    base = EWSDateTime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    for n in range(5):
        ews.deliver(USER, mime(n), received=base + timedelta(minutes=n))
    query = (
        account.inbox.filter(datetime_received__gte=base + timedelta(minutes=2))
        .only("id", "changekey", "datetime_received", "subject")
        .order_by("datetime_received")
    )
    found = list(query)
    assert [i.subject for i in found] == ["hello 2", "hello 3", "hello 4"]
    assert found[0].datetime_received == base + timedelta(minutes=2)
    fetched = list(account.fetch(ids=found, only_fields=["mime_content"]))
    assert [f.mime_content for f in fetched] == [mime(2), mime(3), mime(4)]


def test_find_item_pages(ews: EwsTestServer) -> None:
    account = make_account(ews)
    for n in range(7):
        ews.deliver(USER, mime(n))
    query = account.inbox.all().only("id", "subject").order_by("subject")
    query.page_size = 3
    assert [i.subject for i in query] == [f"hello {n}" for n in range(7)]
    assert ews.operations().count("FindItem") == 3


def test_get_item_unknown_id_is_item_not_found(ews: EwsTestServer) -> None:
    account = make_account(ews)
    item = ews.deliver(USER, mime(1))
    ews.store.mailbox(USER).items.clear()
    with pytest.raises(ErrorItemNotFound):
        account.inbox.get(id=item.item_id, changekey=item.change_key)


def test_missed_event_is_found_by_find_item_only(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    silent = ews.deliver(USER, mime(1), notify=False)
    assert stream(account, sub_id) == []
    assert [i.id for i in account.inbox.all().only("id")] == [silent.item_id]


def test_dropped_stream_surfaces_as_requests_error_and_same_subscription_resumes(
    ews: EwsTestServer,
) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming(event_types=["NewMailEvent"])
    first = ews.deliver(USER, mime(1))
    notifications = account.inbox.get_streaming_events(sub_id, connection_timeout=5)
    assert next(notifications).events[0].item_id.id == first.item_id
    assert ews.drop_streams() == 1
    with pytest.raises(requests.exceptions.RequestException):
        next(notifications)
    # Events raised while no connection is open wait for the subscription's next connection.
    second = ews.deliver(USER, mime(2))
    assert stream(account, sub_id) == [("NewMailEvent", second.item_id)]


def test_cut_notification_loses_its_events(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming(event_types=["NewMailEvent"])
    ews.cut_next_notification()
    lost = ews.deliver(USER, mime(1))
    with pytest.raises(requests.exceptions.RequestException):
        stream(account, sub_id)
    assert stream(account, sub_id) == []
    assert lost.item_id in ews.store.mailbox(USER).items


def test_expired_subscription_is_not_found(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    ews.expire_subscription(sub_id)
    with pytest.raises(ErrorSubscriptionNotFound):
        stream(account, sub_id)


def test_subscription_expires_after_idle_time() -> None:
    with fast_server(subscription_idle_seconds=0.0) as server:
        account = make_account(server)
        sub_id = account.inbox.subscribe_to_streaming()
        assert server.wait_until(lambda: not server.subscription_ids(USER))
        with pytest.raises(ErrorSubscriptionNotFound):
            stream(account, sub_id)


def test_expiring_an_open_stream_closes_it(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    timer = threading.Timer(0.3, ews.expire_subscription, args=(sub_id,))
    timer.start()
    svc = GetStreamingEvents(account=account)
    assert list(svc.call(subscription_ids=[sub_id], connection_timeout=30)) == []
    timer.join()
    assert svc.connection_status == GetStreamingEvents.CLOSED


def test_unsubscribe_then_stream_is_not_found(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    assert account.inbox.unsubscribe(sub_id) is True
    with pytest.raises(ErrorSubscriptionNotFound):
        stream(account, sub_id)


def test_second_connection_supersedes_the_first(ews: EwsTestServer) -> None:
    first_account, second_account = make_account(ews), make_account(ews)
    sub_id = first_account.inbox.subscribe_to_streaming()
    first = first_account.inbox.get_streaming_events(sub_id, connection_timeout=30)
    errors: list[BaseException] = []

    def read_first() -> None:
        try:
            list(first)
        except Exception as e:
            errors.append(e)

    reader = threading.Thread(target=read_first)
    reader.start()
    assert ews.wait_until(lambda: ews.open_streams(sub_id) == 1)
    assert stream(second_account, sub_id) == []
    reader.join()
    assert len(errors) == 1
    assert isinstance(errors[0], ErrorNewEventStreamConnectionOpened)


def test_http_503_is_server_busy(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    ews.fail_requests(1, status=503, operation="GetStreamingEvents")
    with pytest.raises(ErrorServerBusy):
        stream(account, sub_id)
    assert stream(account, sub_id) == []  # the next request goes through


def test_soap_server_busy_fault(ews: EwsTestServer) -> None:
    account = make_account(ews)
    ews.fail_requests(1, soap_code="ErrorServerBusy")
    with pytest.raises(ErrorServerBusy):
        account.inbox.subscribe_to_streaming()


def test_stalled_stream_times_out_on_the_client(ews: EwsTestServer) -> None:
    account = make_account(ews)
    sub_id = account.inbox.subscribe_to_streaming()
    ews.stall_streams()
    svc = GetStreamingEvents(account=account)
    notifications = svc.call(subscription_ids=[sub_id], connection_timeout=30)
    svc.timeout = 1  # read timeout in seconds, applied when the request is sent
    with pytest.raises(requests.exceptions.ConnectionError):
        list(notifications)
    ews.stall_streams(False)
    assert ews.wait_until(lambda: ews.open_streams() == 0)


def test_wrong_password_is_unauthorized(ews: EwsTestServer) -> None:
    with pytest.raises(UnauthorizedError):
        make_account(ews, password="wrong").inbox  # noqa: B018


def test_sync_folder_items_is_not_served_and_is_recorded(ews: EwsTestServer) -> None:
    account = make_account(ews)
    with pytest.raises(ErrorInvalidOperation):
        list(
            SyncFolderItems(account=account).call(
                folder=account.inbox,
                shape="IdOnly",
                additional_fields=None,
                sync_state=None,
                ignore=None,
                max_changes_returned=None,
                sync_scope=None,
            )
        )
    assert "SyncFolderItems" in ews.operations()


def test_item_changes_raise_modified_moved_copied_and_deleted_events_as_exchange_does(
    ews: EwsTestServer,
) -> None:
    account = make_account(ews)
    inbox, junk = account.inbox, account.junk
    sub_id = inbox.subscribe_to_streaming()
    item = ews.deliver(USER, mime(1), notify=False)
    original_id = item.item_id
    ews.update_item(USER, original_id, is_read=True, categories=["Red"])
    copy = ews.copy_item(USER, original_id, "junkemail")
    ews.move_item(USER, original_id, "junkemail")
    ews.delete_item(USER, copy.item_id)
    events = [
        event
        for notification in inbox.get_streaming_events(sub_id, connection_timeout=1)
        for event in notification.events
    ]
    item_events = [e for e in events if e.item_id is not None]
    kinds = [type(e).__name__ for e in item_events]
    # The inbox subscription: the modification, the copy out of it (CopiedEvent names both
    # ends), the move out of it; the deletion in Junk is not the inbox's business.
    assert kinds == ["ModifiedEvent", "CopiedEvent", "MovedEvent"]
    modified, copied, moved = item_events
    assert modified.parent_folder_id.id == inbox.id
    assert copied.item_id.id == copy.item_id and copied.parent_folder_id.id == junk.id
    assert copied.old_item_id.id == original_id and copied.old_parent_folder_id.id == inbox.id
    assert moved.item_id.id == item.item_id != original_id  # a move gives a new ItemId
    assert moved.parent_folder_id.id == junk.id
    assert moved.old_item_id.id == original_id and moved.old_parent_folder_id.id == inbox.id
    # The folder's own ModifiedEvent carries its UnreadCount (the read mail left: 0).
    unread = [e.unread_count for e in events if e.folder_id is not None]
    assert unread and unread[-1] == 0
    assert account.junk.get(id=item.item_id).categories == ["Red"]


def test_moved_events_carry_their_elements_in_schema_order() -> None:
    """types.xsd MovedCopiedEventType: Watermark, TimeStamp, ItemId, ParentFolderId, then
    OldItemId, OldParentFolderId."""
    event = Event(
        "MovedEvent",
        "AQAAA1",
        datetime(2026, 11, 29, 16, 0, tzinfo=DT_UTC),
        ("new", "ck"),
        None,
        ("junk", "j"),
        old_item_id=("old", "ck0"),
        old_parent_folder_id=("inbox", "i"),
    )
    wire = _notifications_envelope({"sub": [event]}).decode()
    names = ("Watermark", "TimeStamp", "ItemId", "ParentFolderId", "OldItemId", "OldParentFolderId")
    positions = [
        wire.index(f"<t:{name} ") if f"<t:{name} " in wire else wire.index(f"<t:{name}>")
        for name in names
    ]
    assert positions == sorted(positions)
