"""Our own sender authentication through the whole product (issue 14 item 3): Dovecot → IMAP
source → Kafka → streams → SMTP sink → the recording SMTP server, with the support workflow on
``require: dmarc-pass`` and every SPF/DKIM/DMARC record served by a dnslib server on loopback
(``streams.auth.nameserver``). No mail carries an ``Authentication-Results`` header: what
decides is our own check of the raw MIME the source put in the claim-check store.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dkim
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from imapclient import IMAPClient
from test_security import Outbox, WorkflowEvents
from test_whole_pipeline import _config as pipeline_config

from connectors.core.config import load_config
from connectors.core.kafka.topics import ensure_topics
from mailtap.components import Pipeline, wait_for
from mailtap.dev import scenario
from tests.support.dns_server import LoopbackDns

#: Hang guard of each wait; nothing asserts on timing.
STAGE_S = 120.0
#: After the refusal is on mail.workflow, how long to keep watching for a reply that must not come.
SETTLE_S = 5.0
BORDER_MTA = "mx.border.example"
GOOD_IP = "192.0.2.10"
BAD_IP = "203.0.113.7"


@dataclass
class Rig:
    imap: IMAPClient
    pipeline: Pipeline
    outbox: Outbox
    events: WorkflowEvents
    domain: str
    private_key: bytes

    def wait(self, predicate: Any, what: str) -> None:
        ok = wait_for(predicate, STAGE_S, interval=0.5)
        self.pipeline.check_alive()
        assert ok, f"{what}; streams log:\n{self.pipeline.components['streams'].log_tail(40)}"


def _key_pair() -> tuple[bytes, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem, f"v=DKIM1; k=rsa; p={base64.b64encode(der).decode()}"


@pytest.fixture(scope="module")
def rig(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    unique = uuid.uuid4().hex[:10]
    tmp_path = tmp_path_factory.mktemp("senderauth")
    domain = f"corp-{unique}.example"  # the sender's own domain, published on our loopback DNS
    private_key, key_record = _key_pair()
    user = services.add_user(f"sa-{unique}@example.com", "pw")
    with LoopbackDns() as dns:
        dns.txt(f"sel._domainkey.{domain}", key_record)
        dns.txt(domain, f"v=spf1 ip4:{GOOD_IP}/32 -all")
        dns.txt(f"_dmarc.{domain}", "v=DMARC1; p=reject")
        path = pipeline_config(services, unique, user, tmp_path, f"streams-{unique}")
        doc = yaml.safe_load(path.read_text())
        streams = doc["streams"]
        streams["workflows"]["ticket_intake"]["require"] = "dmarc-pass"
        streams["auth"] = {
            "trusted_received_by": BORDER_MTA,
            "nameserver": dns.nameserver,
            "dns_timeout_seconds": 2.0,
        }
        path.write_text(yaml.safe_dump(doc))
        # As an operator does first (`mailtap topics ensure`): the streams worker refuses to
        # start before mail.events exists, and the source may create it later under load.
        ensure_topics(load_config(path).kafka, ["5s"])
        outbox = Outbox(Path(services.smtp.received_dir))
        events = WorkflowEvents(path)
        with (
            Pipeline(path, tmp_path / "logs") as pipeline,
            IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client,
        ):
            client.login(user.username, user.password)
            try:
                yield Rig(client, pipeline, outbox, events, domain, private_key)
            finally:
                events.close()


def _mail(rig: Rig, *, ip: str, message_id: str, signed: bool) -> bytes:
    """A mail as our border MTA delivered it: its Received header (with the client's IP) on top
    of what the sender's system wrote, signed by the sender's domain when ``signed``."""
    sender = f"ann@{rig.domain}"
    body = (
        f"From: Ann <{sender}>\r\nTo: {scenario.SUPPORT}\r\nSubject: printer {message_id}\r\n"
        f"Message-ID: <{message_id}>\r\nDate: Tue, 01 Dec 2026 10:00:00 +0000\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nThe printer prints blank pages.\r\n"
    ).encode()
    if signed:
        body = dkim.sign(body, b"sel", rig.domain.encode(), rig.private_key) + body
    trace = (
        f"Return-Path: <{sender}>\r\n"
        f"Received: from mail.{rig.domain} (mail.{rig.domain} [{ip}])\r\n"
        f"\tby {BORDER_MTA} (Postfix) with ESMTPS id 4Q2; Tue, 01 Dec 2026 10:00:01 +0000\r\n"
    ).encode()
    return trace + body


def test_a_spoofed_sender_failing_spf_and_dmarc_is_refused(rig: Rig) -> None:
    mid = f"spoofed-{uuid.uuid4().hex[:8]}@attacker.example"
    rig.imap.append("INBOX", _mail(rig, ip=BAD_IP, message_id=mid, signed=False))

    def refused() -> list[dict[str, Any]]:
        return [e for e in rig.events.about(mid) if e["status"] == "SKIPPED"]

    rig.wait(refused, "no SKIPPED event for the spoofed mail")
    reason = refused()[0]["attributes"]["reason"]
    assert "dmarc=fail" in reason and f"spf=fail for {rig.domain}" in reason, reason
    time.sleep(SETTLE_S)
    assert not [m for m in rig.outbox.to(f"ann@{rig.domain}") if mid in str(m["In-Reply-To"])]


def test_a_properly_signed_mail_is_answered(rig: Rig) -> None:
    mid = f"signed-{uuid.uuid4().hex[:8]}@{rig.domain}"
    rig.imap.append("INBOX", _mail(rig, ip=BAD_IP, message_id=mid, signed=True))

    def answered() -> list[Any]:
        return [m for m in rig.outbox.to(f"ann@{rig.domain}") if mid in str(m["In-Reply-To"])]

    rig.wait(answered, "the signed mail got no reply")
    assert not [e for e in rig.events.about(mid) if e["status"] == "SKIPPED"]


def test_an_unsigned_mail_from_an_ip_the_spf_record_allows_is_answered(rig: Rig) -> None:
    # SPF alone, for the client IP our border MTA wrote in its Received header, aligned with From.
    mid = f"spf-{uuid.uuid4().hex[:8]}@{rig.domain}"
    rig.imap.append("INBOX", _mail(rig, ip=GOOD_IP, message_id=mid, signed=False))

    def answered() -> list[Any]:
        return [m for m in rig.outbox.to(f"ann@{rig.domain}") if mid in str(m["In-Reply-To"])]

    rig.wait(answered, "the mail from an SPF-allowed IP got no reply")
