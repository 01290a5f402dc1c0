"""The Graph test server's mail endpoints over real HTTPS: delta rounds, ids, MIME, faults."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests

from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import USER, app_token, trusting_session

IMMUTABLE = 'IdType="ImmutableId"'


def mime(n: int, subject: str | None = None) -> bytes:
    return (
        f"From: Sender {n} <sender{n}@example.org>\r\nTo: {USER}\r\nCc: cc@example.org\r\n"
        f"Subject: {subject or f'mail {n}'}\r\nMessage-ID: <m{n}@example.org>\r\n"
        f"Date: Fri, 04 Dec 2026 10:00:00 +0000\r\n\r\nbody {n}\r\n"
    ).encode()


@pytest.fixture
def client(graph_server: GraphTestServer) -> requests.Session:
    session = trusting_session(graph_server)
    session.headers["Authorization"] = f"Bearer {app_token(graph_server)}"
    return session


def delta_round(
    client: requests.Session, url: str, prefer: str = IMMUTABLE
) -> tuple[list[dict[str, Any]], str, int]:
    """Follow nextLinks to the deltaLink: (entries, deltaLink, pages)."""
    entries: list[dict[str, Any]] = []
    pages = 0
    while True:
        response = client.get(url, headers={"Prefer": prefer})
        assert response.status_code == 200, response.text
        body = response.json()
        pages += 1
        entries.extend(body["value"])
        if "@odata.nextLink" in body:
            assert "@odata.deltaLink" not in body
            url = body["@odata.nextLink"]
            continue
        return entries, body["@odata.deltaLink"], pages


def start_url(server: GraphTestServer, folder: str = "inbox", select: str | None = None) -> str:
    url = f"{server.graph_url}/users/{USER}/mailFolders/{folder}/messages/delta"
    return f"{url}?$select={select}" if select else url


def test_mail_folders_list_and_well_known_names(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    graph_server.add_folder(USER, "Processed")
    graph_server.add_message(USER, mime(1))
    body = client.get(f"{graph_server.graph_url}/users/{USER}/mailFolders").json()
    names = {f["displayName"]: f for f in body["value"]}
    assert {"Inbox", "Archive", "Deleted Items", "Processed"} <= set(names)
    assert names["Inbox"]["totalItemCount"] == 1
    assert names["Inbox"]["unreadItemCount"] == 1
    inbox = client.get(f"{graph_server.graph_url}/users/{USER}/mailFolders/inbox").json()
    assert inbox["id"] == names["Inbox"]["id"]
    by_id = client.get(f"{graph_server.graph_url}/users/{USER}/mailFolders/{inbox['id']}")
    assert by_id.json()["displayName"] == "Inbox"
    missing = client.get(f"{graph_server.graph_url}/users/{USER}/mailFolders/AQMkADnotthere")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "ErrorItemNotFound"


def test_first_round_pages_every_message_once(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    added = [graph_server.add_message(USER, mime(n)) for n in range(5)]
    entries, delta_link, pages = delta_round(
        client, start_url(graph_server), prefer=f"odata.maxpagesize=2, {IMMUTABLE}"
    )
    assert pages == 3
    assert sorted(e["id"] for e in entries) == sorted(m.immutable_id for m in added)
    assert "$deltatoken=" in delta_link
    assert "/mailFolders('" in delta_link
    first = next(e for e in entries if e["id"] == added[0].immutable_id)
    assert first["@odata.type"] == "#microsoft.graph.message"
    assert first["internetMessageId"] == "<m0@example.org>"
    assert first["from"] == {"emailAddress": {"name": "Sender 0", "address": "sender0@example.org"}}
    assert first["toRecipients"] == [{"emailAddress": {"name": USER, "address": USER}}]
    assert first["flag"] == {"flagStatus": "notFlagged"}
    assert first["isRead"] is False
    assert first["parentFolderId"] == graph_server.folder_id(USER, "inbox")
    assert first["@odata.etag"] == f'W/"{first["changeKey"]}"'
    assert first["receivedDateTime"].endswith("Z")


def test_next_round_has_changes_only(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    kept, read, moved, deleted = (graph_server.add_message(USER, mime(n)) for n in range(4))
    _, delta_link, _ = delta_round(client, start_url(graph_server))
    graph_server.update_message(USER, read.immutable_id, is_read=True, categories=["Red"])
    graph_server.update_message(USER, read.immutable_id, flag_status="flagged")
    graph_server.move_message(USER, moved.immutable_id, "archive")
    graph_server.delete_message(USER, deleted.immutable_id)
    new = graph_server.add_message(USER, mime(9))
    entries, next_link, _ = delta_round(client, delta_link)
    by_id = {e["id"]: e for e in entries}
    assert set(by_id) == {
        read.immutable_id,
        moved.immutable_id,
        deleted.immutable_id,
        new.immutable_id,
    }
    assert kept.immutable_id not in by_id
    assert by_id[read.immutable_id]["isRead"] is True
    assert by_id[read.immutable_id]["categories"] == ["Red"]
    assert by_id[read.immutable_id]["flag"] == {"flagStatus": "flagged"}
    for gone in (moved, deleted):
        assert by_id[gone.immutable_id] == {
            "@odata.type": "#microsoft.graph.message",
            "id": gone.immutable_id,
            "@removed": {"reason": "deleted"},
        }
    # Nothing changed since: an empty round with a deltaLink.
    assert delta_round(client, next_link)[0] == []


def test_immutable_id_survives_a_move_the_default_id_does_not(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    message = graph_server.add_message(USER, mime(1))
    default_before = delta_round(client, start_url(graph_server), prefer="")[0][0]["id"]
    immutable_before = delta_round(client, start_url(graph_server))[0][0]["id"]
    graph_server.move_message(USER, message.immutable_id, "archive")
    default_after = delta_round(client, start_url(graph_server, "archive"), prefer="")[0][0]["id"]
    immutable_after = delta_round(client, start_url(graph_server, "archive"))[0][0]["id"]
    assert immutable_before == immutable_after == message.immutable_id
    assert default_before != default_after
    response = client.get(start_url(graph_server), headers={"Prefer": IMMUTABLE})
    assert response.headers["Preference-Applied"] == IMMUTABLE
    assert "Preference-Applied" not in client.get(start_url(graph_server)).headers


def test_removed_entry_carries_the_id_the_client_knew(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    message = graph_server.add_message(USER, mime(1))
    entries, delta_link, _ = delta_round(client, start_url(graph_server), prefer="")
    known = entries[0]["id"]
    graph_server.move_message(USER, message.immutable_id, "archive")
    removed = delta_round(client, delta_link, prefer="")[0]
    assert removed == [
        {"@odata.type": "#microsoft.graph.message", "id": known, "@removed": {"reason": "deleted"}}
    ]


def test_select_is_kept_in_the_links(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    for n in range(3):
        graph_server.add_message(USER, mime(n))
    entries, delta_link, _ = delta_round(
        client,
        start_url(graph_server, select="subject,isRead"),
        prefer=f"odata.maxpagesize=1,{IMMUTABLE}",
    )
    assert len(entries) == 3
    for entry in entries:
        assert set(entry) == {"@odata.type", "@odata.etag", "id", "subject", "isRead"}
    graph_server.add_message(USER, mime(7))
    (entry,) = delta_round(client, delta_link)[0]
    assert set(entry) == {"@odata.type", "@odata.etag", "id", "subject", "isRead"}
    bad = client.get(start_url(graph_server, select="subject,nonsense"))
    assert bad.status_code == 400
    assert "nonsense" in bad.json()["error"]["message"]


def test_replayed_change_comes_back(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    message = graph_server.add_message(USER, mime(1))
    _, delta_link, _ = delta_round(client, start_url(graph_server))
    graph_server.update_message(USER, message.immutable_id, is_read=True)
    first, delta_link, _ = delta_round(client, delta_link)
    graph_server.replay_changes(USER, "inbox")
    second, delta_link, _ = delta_round(client, delta_link)
    assert [e["id"] for e in first] == [e["id"] for e in second] == [message.immutable_id]
    assert second[0]["isRead"] is True
    assert delta_round(client, delta_link)[0] == []  # once only


@pytest.mark.parametrize("code", ["syncStateNotFound", "resyncRequired"])
def test_expired_delta_token_is_gone(
    graph_server: GraphTestServer, client: requests.Session, code: str
) -> None:
    graph_server.add_message(USER, mime(1))
    _, delta_link, _ = delta_round(client, start_url(graph_server))
    assert graph_server.expire_delta_tokens(USER, "inbox", code=code) >= 1
    gone = client.get(delta_link, headers={"Prefer": IMMUTABLE})
    assert gone.status_code == 410
    assert gone.json()["error"]["code"] == code
    if code == "resyncRequired":
        # "a Location header containing a request URL with an empty $deltaToken"
        location = gone.headers["Location"]
        assert location.endswith("/messages/delta")
        assert len(delta_round(client, location)[0]) == 1
    # A new round (no token) works, and its tokens are alive.
    entries, fresh_link, _ = delta_round(client, start_url(graph_server))
    assert len(entries) == 1
    assert client.get(fresh_link).status_code == 200


def test_unknown_token_is_a_bad_request(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    response = client.get(start_url(graph_server) + "?$deltatoken=never-issued")
    assert response.status_code == 400


def test_mime_value_and_single_message(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    raw = mime(3)
    message = graph_server.add_message(USER, raw)
    base = f"{graph_server.graph_url}/users/{USER}/messages"
    value = client.get(f"{base}/{message.immutable_id}/$value")
    assert value.status_code == 200
    assert value.content == raw
    by_rest_id = client.get(f"{base}/{message.rest_id}", headers={"Prefer": IMMUTABLE}).json()
    assert by_rest_id["id"] == message.immutable_id
    assert by_rest_id["subject"] == "mail 3"
    folder_path = f"{graph_server.graph_url}/users/{USER}/mailFolders/inbox/messages"
    assert client.get(f"{folder_path}/{message.immutable_id}/$value").content == raw
    assert client.get(f"{base}/AAMkAGnothere").status_code == 404


def test_user_id_works_as_well_as_the_address(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    user_id = graph_server.store.require_mailbox(USER).user_id
    response = client.get(f"{graph_server.graph_url}/users/{user_id}/mailFolders/inbox")
    assert response.status_code == 200


def test_throttling_answers_with_retry_after(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    graph_server.fail_requests(1, status=429, retry_after=7, path_contains="delta")
    graph_server.fail_requests(1, status=503, retry_after=2)
    throttled = client.get(start_url(graph_server))
    assert throttled.status_code == 429
    assert throttled.headers["Retry-After"] == "7"
    assert throttled.json()["error"]["code"] == "TooManyRequests"
    unavailable = client.get(start_url(graph_server))
    assert unavailable.status_code == 503
    assert unavailable.headers["Retry-After"] == "2"
    assert client.get(start_url(graph_server)).status_code == 200


def test_mailbox_concurrency_limit(graph_server: GraphTestServer) -> None:
    """Four requests of one app in flight on one mailbox: a fifth and sixth get 429 at once;
    the four are answered when released; another app has its own four."""
    from tests.graph_server.fixture import CLIENT_ID

    token = app_token(graph_server)
    graph_server.hold_responses()
    statuses: list[tuple[int, str]] = []
    lock = threading.Lock()

    def call() -> None:
        session = trusting_session(graph_server)
        response = session.get(
            f"{graph_server.graph_url}/users/{USER}/mailFolders",
            headers={"Authorization": f"Bearer {token}"},
        )
        code = (
            response.json().get("error", {}).get("code", "") if response.status_code != 200 else ""
        )
        with lock:
            statuses.append((response.status_code, code))

    held = [threading.Thread(target=call) for _ in range(4)]
    for thread in held:
        thread.start()
    assert graph_server.wait_until(lambda: graph_server.in_flight(CLIENT_ID, USER) == 4, 20)
    for _ in range(2):
        call()  # answered while the four are held
    assert statuses == [(429, "ApplicationThrottled")] * 2
    graph_server.release_responses()
    for thread in held:
        thread.join(30)
    assert sorted(statuses) == [(200, "")] * 4 + [(429, "ApplicationThrottled")] * 2
    assert graph_server.in_flight(CLIENT_ID, USER) == 0


def test_revoked_access_and_deleted_mailbox(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    from tests.graph_server.fixture import CLIENT_ID

    url = f"{graph_server.graph_url}/users/{USER}/mailFolders"
    graph_server.revoke_access(CLIENT_ID, USER)
    denied = client.get(url)
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "ErrorAccessDenied"
    graph_server.delete_mailbox(USER)
    gone = client.get(url)
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "MailboxNotEnabledForRESTAPI"
    unknown = client.get(f"{graph_server.graph_url}/users/nobody@example.com/mailFolders")
    assert unknown.status_code == 404


def test_bench_baseline_counts_what_it_paged(graph_server: GraphTestServer) -> None:
    """The baseline helper of `mailtap bench graph` reads every message and its MIME once."""
    import asyncio

    from tests.graph_server.bench import raw_delta_paging, raw_delta_paging_async, seed

    seed(graph_server, USER, 25, size=1000)
    token = app_token(graph_server)
    figures = raw_delta_paging(graph_server, token, USER, page_size=10, mime=True)
    assert (figures.messages, figures.pages, figures.removed) == (25, 3, 0)
    assert figures.mime_bytes == sum(len(m.mime) for m in graph_server.messages(USER))
    _, delta_link = asyncio.run(raw_delta_paging_async(graph_server, token, USER, mime=False))
    graph_server.delete_message(USER, graph_server.messages(USER)[0].immutable_id)
    after, _ = asyncio.run(raw_delta_paging_async(graph_server, token, USER, delta_link=delta_link))
    assert (after.messages, after.removed, after.mime_bytes) == (0, 1, 0)


@pytest.mark.parametrize("change_type", ["created", "updated", "deleted"])
def test_change_type_option_filters_later_rounds(
    graph_server: GraphTestServer, client: requests.Session, change_type: str
) -> None:
    """delta-query-messages, example 2: the first round returns every message; later rounds
    only the changes of the chosen type."""
    updated, deleted = (graph_server.add_message(USER, mime(n)) for n in range(2))
    entries, delta_link, _ = delta_round(
        client, start_url(graph_server) + f"?changeType={change_type}"
    )
    assert len(entries) == 2
    graph_server.update_message(USER, updated.immutable_id, is_read=True)
    graph_server.move_message(USER, deleted.immutable_id, "archive")
    created = graph_server.add_message(USER, mime(5))
    expected = {"created": created, "updated": updated, "deleted": deleted}[change_type]
    assert [e["id"] for e in delta_round(client, delta_link)[0]] == [expected.immutable_id]


def test_request_rate_limit_per_app_and_mailbox() -> None:
    from tests.graph_server.fixture import running_server

    with running_server(mailbox_request_limit=3, mailbox_request_window=30.0) as graph:
        session = trusting_session(graph)
        session.headers["Authorization"] = f"Bearer {app_token(graph)}"
        url = f"{graph.graph_url}/users/{USER}/mailFolders"
        assert [session.get(url).status_code for _ in range(3)] == [200, 200, 200]
        throttled = session.get(url)
        assert throttled.status_code == 429
        assert throttled.json()["error"]["code"] == "ApplicationThrottled"
        assert 1 <= int(throttled.headers["Retry-After"]) <= 30
        graph.add_mailbox("other@example.com")  # another mailbox has its own budget
        assert (
            session.get(f"{graph.graph_url}/users/other@example.com/mailFolders").status_code == 200
        )


def test_folder_select(graph_server: GraphTestServer, client: requests.Session) -> None:
    url = f"{graph_server.graph_url}/users/{USER}/mailFolders/inbox"
    body = client.get(url, params={"$select": "id"}).json()
    assert set(body) == {"@odata.context", "id"}
    assert body["id"] == graph_server.folder_id(USER, "inbox")
    listed = client.get(
        f"{graph_server.graph_url}/users/{USER}/mailFolders?$select=displayName"
    ).json()
    assert all(set(f) == {"id", "displayName"} for f in listed["value"])
    assert client.get(url, params={"$select": "subject"}).status_code == 400
