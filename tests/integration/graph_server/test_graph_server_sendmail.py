"""sendMail of the Graph test server: JSON and MIME, Sent Items, delivery, NDR for bounces."""

from __future__ import annotations

import base64
import email
import email.policy

import pytest
import requests

from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import USER, app_token, trusting_session


@pytest.fixture
def client(graph_server: GraphTestServer) -> requests.Session:
    session = trusting_session(graph_server)
    session.headers["Authorization"] = f"Bearer {app_token(graph_server)}"
    return session


def send_url(graph: GraphTestServer) -> str:
    return f"{graph.graph_url}/users/{USER}/sendMail"


def test_json_message_is_accepted_saved_and_delivered(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    graph_server.add_mailbox("colleague@example.com")
    response = client.post(
        send_url(graph_server),
        json={
            "message": {
                "subject": "Meet for lunch?",
                "body": {"contentType": "Text", "content": "The new cafeteria is open."},
                "toRecipients": [{"emailAddress": {"address": "colleague@example.com"}}],
                "bccRecipients": [{"emailAddress": {"address": "outside@example.net"}}],
                "internetMessageHeaders": [{"name": "x-mailtap-command", "value": "c-1"}],
            },
            "saveToSentItems": "true",
        },
    )
    assert response.status_code == 202
    assert response.content == b""
    (sent,) = graph_server.sent
    assert sent.recipients == ("colleague@example.com", "outside@example.net")
    parsed = email.message_from_bytes(sent.mime, policy=email.policy.default)
    assert parsed["From"] == USER
    assert parsed["x-mailtap-command"] == "c-1"
    assert parsed.get_content().strip() == "The new cafeteria is open."
    (copy,) = graph_server.messages(USER, "sentitems")
    assert copy.subject == "Meet for lunch?" and copy.is_read
    (delivered,) = graph_server.messages("colleague@example.com", "inbox")
    assert delivered.internet_message_id == parsed["Message-ID"]
    assert b"outside@example.net" not in delivered.mime  # Bcc is not shown to recipients


def test_mime_variant_keeps_the_message_id_and_can_skip_sent_items(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    mime = (
        f"From: {USER}\r\nTo: someone@example.net\r\nSubject: Re: ticket 7\r\n"
        "Message-ID: <reply-7@mailtap.example>\r\nIn-Reply-To: <t7@example.net>\r\n\r\nDone.\r\n"
    ).encode()
    response = client.post(
        send_url(graph_server), data=base64.b64encode(mime), headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 202
    (sent,) = graph_server.sent
    assert sent.mime == mime
    assert sent.recipients == ("someone@example.net",)
    assert (
        graph_server.messages(USER, "sentitems")[0].internet_message_id
        == "<reply-7@mailtap.example>"
    )
    no_copy = client.post(
        send_url(graph_server),
        json={
            "message": {
                "subject": "x",
                "toRecipients": [{"emailAddress": {"address": "a@example.net"}}],
            },
            "saveToSentItems": False,
        },
    )
    assert no_copy.status_code == 202
    assert len(graph_server.messages(USER, "sentitems")) == 1


def test_malformed_requests_are_refused(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    bad_mime = client.post(
        send_url(graph_server), data=b"%%% not base64 %%%", headers={"Content-Type": "text/plain"}
    )
    assert bad_mime.status_code == 400
    assert bad_mime.json()["error"] == {
        "code": "ErrorMimeContentInvalidBase64String",
        "message": "Invalid base64 string for MIME content.",
        "innerError": bad_mime.json()["error"]["innerError"],
    }
    no_recipients = client.post(send_url(graph_server), json={"message": {"subject": "x"}})
    assert no_recipients.status_code == 400
    bad_header = client.post(
        send_url(graph_server),
        json={
            "message": {
                "toRecipients": [{"emailAddress": {"address": "a@example.net"}}],
                "internetMessageHeaders": [{"name": "Message-ID", "value": "<x@y>"}],
            }
        },
    )
    assert bad_header.status_code == 400
    assert graph_server.sent == []


def test_bouncing_recipient_gets_an_ndr_into_the_senders_inbox(
    graph_server: GraphTestServer, client: requests.Session
) -> None:
    graph_server.bounce_recipient("gone@example.net")
    mime = (
        f"From: {USER}\r\nTo: gone@example.net\r\nSubject: Your order\r\n"
        "Message-ID: <order-1@mailtap.example>\r\n\r\nHello\r\n"
    ).encode()
    response = client.post(
        send_url(graph_server), data=base64.b64encode(mime), headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 202  # accepted: the bounce comes later, as mail
    (ndr,) = graph_server.messages(USER, "inbox")
    assert ndr.subject == "Undeliverable: Your order"
    report = email.message_from_bytes(ndr.mime, policy=email.policy.default)
    assert report.get_content_type() == "multipart/report"
    assert report.get_param("report-type") == "delivery-status"
    assert report["In-Reply-To"] == "<order-1@mailtap.example>"
    parts = [part.get_content_type() for part in report.iter_parts()]
    assert parts == ["text/plain", "message/delivery-status", "text/rfc822-headers"]
    status_text = ndr.mime.decode()
    assert "Final-Recipient: rfc822;gone@example.net" in status_text
    assert "Action: failed" in status_text
    assert "Status: 5.1.1" in status_text
    assert "Message-ID: <order-1@mailtap.example>" in status_text
