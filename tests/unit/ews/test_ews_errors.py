"""How exchangelib and requests failures map to the source's errors, one named test per case."""

from __future__ import annotations

import ssl
from types import SimpleNamespace

import pytest
import requests
from exchangelib import errors as ews_errors
from exchangelib.properties import (
    CopiedEvent,
    CreatedEvent,
    DeletedEvent,
    FolderId,
    ItemId,
    ModifiedEvent,
    MovedEvent,
    NewMailEvent,
    OldItemId,
    OldParentFolderId,
    ParentFolderId,
)

from connectors.core.errors import AuthenticationError, ConfigError, Disposition, classify
from connectors.ews.connection import Change, ChangeKind, ItemRef, _arrivals, _changes, translate
from connectors.ews.errors import ConnectionLost, EwsProtocolError, SubscriptionGone


@pytest.mark.parametrize(
    "exc",
    [
        ews_errors.ErrorSubscriptionNotFound("gone"),
        ews_errors.ErrorExpiredSubscription("expired"),
        ews_errors.ErrorInvalidSubscription("invalid"),
    ],
    ids=["not-found", "expired", "invalid"],
)
def test_subscription_errors_mean_subscribe_again(exc: Exception) -> None:
    assert isinstance(translate(exc), SubscriptionGone)


def test_unauthorized_is_permanent() -> None:
    error = translate(ews_errors.UnauthorizedError("bad password"))
    assert isinstance(error, AuthenticationError)
    assert classify(error) is Disposition.PERMANENT


def test_access_denied_is_permanent() -> None:
    assert classify(translate(ews_errors.ErrorAccessDenied("no"))) is Disposition.PERMANENT


def test_mid_stream_drop_from_requests_is_a_connection_loss() -> None:
    error = translate(requests.exceptions.ChunkedEncodingError("Response ended prematurely"))
    assert isinstance(error, ConnectionLost)
    assert classify(error) is Disposition.RETRY


def test_read_timeout_of_a_stalled_stream_is_a_connection_loss() -> None:
    error = translate(requests.exceptions.ConnectionError("Read timed out."))
    assert isinstance(error, ConnectionLost)


def test_server_busy_is_a_connection_loss() -> None:
    assert isinstance(translate(ews_errors.ErrorServerBusy("503")), ConnectionLost)


def test_new_stream_opened_elsewhere_is_a_connection_loss() -> None:
    exc = ews_errors.ErrorNewEventStreamConnectionOpened("another connection")
    assert isinstance(translate(exc), ConnectionLost)


def test_tls_verification_failure_is_a_permanent_config_error() -> None:
    # exchangelib re-raises requests' SSLError as a TransportError inside its except block.
    cause = requests.exceptions.SSLError(ssl.SSLCertVerificationError("self-signed"))
    raised = ews_errors.TransportError(str(cause))
    raised.__context__ = cause
    error = translate(raised, "https://mail.example.com/EWS/Exchange.asmx")
    assert isinstance(error, ConfigError)
    assert "ca_file" in str(error)
    assert classify(error) is Disposition.PERMANENT


def test_bare_transport_error_is_a_connection_loss() -> None:
    assert isinstance(translate(ews_errors.TransportError("no route")), ConnectionLost)


def test_unknown_ews_error_is_a_protocol_error_and_retried() -> None:
    error = translate(ews_errors.ErrorQuotaExceeded("full"))
    assert isinstance(error, EwsProtocolError)
    assert classify(error) is Disposition.RETRY


# --- which notification events are new items of the folder -------------------------------------

FOLDER = "inbox-id"


def notification(*events: object) -> SimpleNamespace:
    return SimpleNamespace(events=list(events))


def test_new_mail_and_created_events_name_one_item_once() -> None:
    item = ItemId("item-1", "ck-1")
    parent = ParentFolderId(FOLDER, "f")
    refs = _arrivals(
        notification(
            NewMailEvent(item_id=item, parent_folder_id=parent),
            CreatedEvent(item_id=item, parent_folder_id=parent),
        ),
        FOLDER,
    )
    assert refs == [ItemRef("item-1", "ck-1")]


def test_folder_modified_events_are_not_items() -> None:
    event = ModifiedEvent(
        folder_id=FolderId(FOLDER, "f"), parent_folder_id=ParentFolderId("root", "r")
    )
    assert _arrivals(notification(event), FOLDER) == []


def test_moved_in_counts_and_moved_out_does_not() -> None:
    moved_in = MovedEvent(item_id=ItemId("in", "c"), parent_folder_id=ParentFolderId(FOLDER, "f"))
    moved_out = MovedEvent(item_id=ItemId("out", "c"), parent_folder_id=ParentFolderId("junk", "j"))
    assert _arrivals(notification(moved_in, moved_out), FOLDER) == [ItemRef("in", "c")]


# --- which notification events change items of the folder, and how -----------------------------

JUNK = "junk-id"
WATCHED = {FOLDER: "inbox", JUNK: "junkemail"}


def test_a_modified_item_of_the_folder_is_a_modification_and_a_modified_folder_is_nothing() -> None:
    events = notification(
        ModifiedEvent(item_id=ItemId("a", "ck2"), parent_folder_id=ParentFolderId(FOLDER, "f")),
        ModifiedEvent(item_id=ItemId("b", "ck2"), parent_folder_id=ParentFolderId(JUNK, "j")),
        ModifiedEvent(folder_id=FolderId(FOLDER, "f"), parent_folder_id=ParentFolderId("r", "r")),
    )
    assert _changes(events, FOLDER, WATCHED) == [Change(ChangeKind.MODIFIED, "a", "ck2")]


def test_moves_name_the_watched_folder_at_the_other_end() -> None:
    events = notification(
        # in from the other watched folder (a new ItemId; OldItemId is where it was)
        MovedEvent(
            item_id=ItemId("new-1", "c"),
            parent_folder_id=ParentFolderId(FOLDER, "f"),
            old_item_id=OldItemId("old-1", "c0"),
            old_parent_folder_id=OldParentFolderId(JUNK, "j"),
        ),
        # out to the other watched folder
        MovedEvent(
            item_id=ItemId("new-2", "c"),
            parent_folder_id=ParentFolderId(JUNK, "j"),
            old_item_id=OldItemId("old-2", "c0"),
            old_parent_folder_id=OldParentFolderId(FOLDER, "f"),
        ),
        # out to a folder nobody watches (Deleted Items)
        MovedEvent(
            item_id=ItemId("new-3", "c"),
            parent_folder_id=ParentFolderId("deleted-id", "d"),
            old_item_id=OldItemId("old-3", "c0"),
            old_parent_folder_id=OldParentFolderId(FOLDER, "f"),
        ),
    )
    assert _changes(events, FOLDER, WATCHED) == [
        Change(ChangeKind.ARRIVED, "new-1", "c", "junkemail"),
        Change(ChangeKind.GONE, "old-2", "c0", "junkemail"),
        Change(ChangeKind.GONE, "old-3", "c0", None),
    ]


def test_a_copy_arrives_in_its_folder_only_and_a_hard_delete_is_gone() -> None:
    events = notification(
        CopiedEvent(
            item_id=ItemId("copy", "c"),
            parent_folder_id=ParentFolderId(FOLDER, "f"),
            old_item_id=OldItemId("orig", "c0"),
            old_parent_folder_id=OldParentFolderId("drafts-id", "d"),
        ),
        CopiedEvent(  # the original stays here: nothing leaves the folder
            item_id=ItemId("copy-2", "c"),
            parent_folder_id=ParentFolderId(JUNK, "j"),
            old_item_id=OldItemId("orig-2", "c0"),
            old_parent_folder_id=OldParentFolderId(FOLDER, "f"),
        ),
        DeletedEvent(item_id=ItemId("gone", "c"), parent_folder_id=ParentFolderId(FOLDER, "f")),
    )
    assert _changes(events, FOLDER, WATCHED) == [
        Change(ChangeKind.ARRIVED, "copy", "c", None),
        Change(ChangeKind.GONE, "gone", "c", None),
    ]
