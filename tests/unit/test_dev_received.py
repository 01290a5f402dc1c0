"""mailtap.dev.received: the SMTP server's folder format."""

from __future__ import annotations

from pathlib import Path

from mailtap.dev.received import received_messages, received_names, store

RAW = b"From: a@example.org\r\nTo: b@example.com\r\nSubject: hi\r\n\r\nbody\r\n"


def test_stored_messages_read_back_in_arrival_order(tmp_path: Path) -> None:
    store(tmp_path, 1, "a@example.org", ["b@example.com"], RAW)
    store(tmp_path, 2, "", ["c@example.com", "d@example.com"], RAW.replace(b"hi", b"second"))

    first, second = received_messages(tmp_path)
    assert (first.mail_from, first.rcpt_tos) == ("a@example.org", ("b@example.com",))
    assert first.raw == RAW
    assert first.message["Subject"] == "hi"
    assert second.mail_from == ""  # null return path, as in a DSN
    assert second.rcpt_tos == ("c@example.com", "d@example.com")
    assert second.message["Subject"] == "second"
    assert first.received_at <= second.received_at
    assert first.received_at.tzinfo is not None


def test_a_message_without_its_envelope_is_not_listed_yet(tmp_path: Path) -> None:
    (tmp_path / "000001-1.eml").write_bytes(RAW)  # the server writes the .json last
    assert received_messages(tmp_path) == []
    assert received_messages(tmp_path / "absent") == []


def test_messages_already_read_are_skipped_without_reading_them(tmp_path: Path) -> None:
    first = store(tmp_path, 1, "a@example.org", ["b@example.com"], RAW)
    assert received_names(tmp_path) == {first.name}
    first.unlink()  # reading it again would fail: it must not be read
    second = store(tmp_path, 2, "a@example.org", ["b@example.com"], RAW)
    assert [m.path for m in received_messages(tmp_path, skip={first.name})] == [second]
    assert received_names(tmp_path / "absent") == set()
