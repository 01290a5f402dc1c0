"""Searches against Dovecot: ESEARCH ranges (RFC 4731) and the plain SEARCH fallback agree."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator

import pytest

from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.search import any_message_id
from connectors.imap.uidset import UidSet
from tests.integration.imap.imap_harness import ImapHarness, make_mail


@pytest.fixture
def gappy(imap: ImapHarness) -> ImapHarness:
    """INBOX with UIDs 1..30 minus the expunged 5, 6, 7, 20 and 30; mail 25 is large."""
    imap.append(
        make_mail(f"s{i}-{imap.unique}@example.com", f"s {i}", body="x" * (5000 if i == 25 else 10))
        for i in range(1, 31)
    )
    client = imap.client()
    client.delete_messages([5, 6, 7, 20, 30])  # sequence numbers = UIDs before any expunge
    client.expunge()
    client.logout()
    return imap


@contextlib.contextmanager
def _connection(imap: ImapHarness, esearch: bool) -> Iterator[ImapConnection]:
    account = ImapAccountSettings.model_validate(imap.config_dict()["imap"]["accounts"][0])
    conn = ImapConnection(account, connect_timeout=5, read_timeout=10)
    conn.connect()
    conn.login()
    assert b"ESEARCH" in conn._capabilities  # Dovecot offers it; the fallback is forced below
    if not esearch:
        conn._capabilities = conn._capabilities - {b"ESEARCH"}
    conn.select("INBOX", readonly=True)
    try:
        yield conn
    finally:
        conn.logout()


@pytest.mark.parametrize("esearch", [True, False], ids=["esearch", "plain-search"])
def test_searches_give_the_uids_as_ranges(gappy: ImapHarness, esearch: bool) -> None:
    expected = [u for u in range(1, 31) if u not in (5, 6, 7, 20, 30)]
    with _connection(gappy, esearch) as conn:
        everything = conn.all_uids()
        assert isinstance(everything, UidSet)
        assert everything.ranges == ((1, 4), (8, 19), (21, 29))
        assert everything == expected
        assert conn.uids_from(10) == [u for u in expected if u >= 10]
        # "31:*" matches the highest UID (29): nothing is new.
        assert list(conn.uids_from(31)) == []
        assert conn.uids_larger(1, 29, 2000) == [25]
        assert conn.uids_larger(1, 24, 2000) == []
        assert conn.uids_since(dt.date(2000, 1, 1)) == expected
        assert list(conn.uids_since(dt.date.today() + dt.timedelta(days=2))) == []


def test_an_empty_folder_has_no_uids(imap: ImapHarness) -> None:
    with _connection(imap, esearch=True) as conn:
        assert len(conn.all_uids()) == 0 and len(conn.uids_from(1)) == 0


def test_message_ids_in_another_folder_are_found_in_chunks(imap: ImapHarness) -> None:
    present = [f"kept{i}-{imap.unique}@example.com" for i in range(30)]
    imap.append((make_mail(m, f"kept {i}") for i, m in enumerate(present)), folder="INBOX")
    absent = [f"gone{i}-{imap.unique}@example.com" for i in range(40)]
    asked = sorted(absent + present[::3])  # 50 ids: a chunk of 25 without a hit, one with
    with _connection(imap, esearch=True) as conn:
        assert conn.message_ids_in("INBOX", asked) == set(present[::3])
        assert conn.message_ids_in("INBOX", absent) == set()
        assert conn.message_ids_in("No-Such-Folder", asked) == set()
        assert conn.message_ids_in("INBOX", []) == set()


def test_any_message_id_is_an_or_chain() -> None:
    assert any_message_id(["a@x"]) == ["HEADER", "Message-ID", "a@x"]
    assert any_message_id(["a@x", "b@x", "c@x"]) == [
        "OR", "HEADER", "Message-ID", "a@x",
        "OR", "HEADER", "Message-ID", "b@x",
        "HEADER", "Message-ID", "c@x",
    ]  # fmt: skip
