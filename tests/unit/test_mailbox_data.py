"""What a purge deletes (mailtap.mailbox_data.plan_purge) and the bulk file of
``mailtap mailboxes add --file``; pure, no Kafka."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from connectors.core.config import ClaimCheckSettings
from connectors.core.errors import ConfigError
from connectors.core.source.ownership.group import WorkUnit
from mailtap.commands.mailboxes import read_mailbox_file
from mailtap.mailbox_data import blob_files, cursor_key, delete_blob_files, plan_purge
from mailtap.trace import TopicRecord

UNIT = WorkUnit("imap", "support", "INBOX")
PACK = "file:///claims/pack/2026-12-05/p1.pack"


def event(key: str, *, account: str = "support", folder: str = "INBOX", **refs: Any) -> dict:
    return {
        "key": key,
        "account": account,
        "source": {"kind": "IMAP", "folder": folder},
        "raw_ref": {"uri": refs["raw"]} if "raw" in refs else None,
        "attachments": [{"uri": u} for u in refs.get("attachments", ())],
    }


def records(*values: tuple[str, dict | None]) -> list[TopicRecord]:
    return [TopicRecord("mail.events", 0, i, 0, k, v) for i, (k, v) in enumerate(values)]


def test_the_mailbox_keys_and_only_the_blobs_nobody_else_refers_to() -> None:
    plan = plan_purge(
        records(
            (
                "support/a",
                event("support/a", raw=f"{PACK}#offset=0", attachments=["file:///claims/x/1"]),
            ),
            (
                "support/b",
                event(
                    "support/b", raw="file:///claims/raw/2", attachments=["file:///claims/x/shared"]
                ),
            ),
            # Another account's mail with the same attachment: the blob stays.
            ("sales/c", event("sales/c", account="sales", attachments=["file:///claims/x/shared"])),
            # A mail of the account that moved on to Archive: its newest event decides.
            ("support/d", event("support/d", raw="file:///claims/raw/4")),
            ("support/d", event("support/d", folder="Archive", raw="file:///claims/raw/4")),
            # A mail already gone (tombstone): nothing to do for it.
            ("support/e", event("support/e", raw="file:///claims/raw/5")),
            ("support/e", None),
        ),
        UNIT,
    )
    assert plan.keys == ["support/a", "support/b"]
    assert plan.blobs == [
        f"{PACK}#offset=0",
        "file:///claims/raw/2",
        "file:///claims/x/1",
    ]
    assert plan.shared_blobs == ["file:///claims/x/shared"]


def test_a_pack_stays_while_a_staying_mail_has_a_blob_in_it() -> None:
    plan = plan_purge(
        records(
            ("support/a", event("support/a", raw=f"{PACK}#offset=0")),
            ("support/f", event("support/f", folder="Sent", raw=f"{PACK}#offset=900")),
        ),
        UNIT,
    )
    assert plan.keys == ["support/a"]
    assert plan.blobs == []
    assert plan.shared_blobs == [f"{PACK}#offset=0"]


def test_an_ews_purge_takes_only_ews_mail() -> None:
    ews = event("support/g")
    ews["source"]["kind"] = "EWS"
    plan = plan_purge(records(("support/g", ews), ("support/a", event("support/a"))), UNIT)
    assert plan.keys == ["support/a"]
    assert plan_purge(records(("support/g", ews)), WorkUnit("ews", "support", "INBOX")).keys == [
        "support/g"
    ]


def test_the_cursor_key_is_the_sources_offsets_key() -> None:
    assert cursor_key(UNIT) == b'{"account":"support","folder":"INBOX","source":"imap"}'


def test_a_mailbox_file_lists_many_mailboxes(tmp_path: Path) -> None:
    f = tmp_path / "mailboxes.yaml"
    f.write_text("imap:\n  support: [INBOX, Archive]\news:\n  exchange: inbox\n")
    assert [str(u) for u in read_mailbox_file(str(f))] == [
        "imap/support/INBOX",
        "imap/support/Archive",
        "ews/exchange/inbox",
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- imap/support/INBOX\n", "expected a mapping"),
        ("pop3:\n  a: [INBOX]\n", "unknown source 'pop3'"),
        ("imap:\n  support: []\n", "imap.support: expected a list of folders"),
        ("imap: [support]\n", "expected ACCOUNT: [FOLDER, ...]"),
        ("imap: {support: [INBOX\n", "not valid YAML"),
    ],
)
def test_a_bad_mailbox_file_is_refused_with_what_to_fix(
    tmp_path: Path, text: str, says: str
) -> None:
    f = tmp_path / "mailboxes.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=says.replace("[", r"\[").replace(".", r"\.")):
        read_mailbox_file(str(f))


def test_blob_files_are_checked_before_anything_is_deleted(tmp_path: Path) -> None:
    root = tmp_path / "claims"
    (root / "raw").mkdir(parents=True)
    blob = root / "raw" / ("a" * 64)
    blob.write_bytes(b"mail")
    pack = root / "pack" / "p1.pack"
    pack.parent.mkdir()
    pack.write_bytes(b"two blobs")
    settings = ClaimCheckSettings(url=root.as_uri())
    uris = [blob.as_uri(), f"{pack.as_uri()}#offset=0", f"{pack.as_uri()}#offset=4"]
    files = blob_files(settings, uris)
    assert files == sorted([blob.as_uri(), pack.as_uri()])  # the pack once
    elsewhere = (tmp_path / "other" / "x").as_uri()
    with pytest.raises(ConfigError, match="outside the claim-check store"):
        blob_files(settings, [*uris, elsewhere])
    with pytest.raises(ConfigError, match="neither file:// nor s3://"):
        blob_files(settings, ["http://example.com/x"])
    assert blob.exists() and pack.exists()  # a refusal deletes nothing
    assert delete_blob_files(settings, [*files, (root / "gone").as_uri()]) == [
        *files,
        (root / "gone").as_uri(),
    ]
    assert not blob.exists() and not pack.exists()
