"""The single-part shortcut of content.py gives exactly what the stdlib parser path gives.

Every mail is run through ``extract_content`` twice, once as is and once with the shortcut
switched off, and the two results must be equal field by field. The inputs aim at the places
where the two could part: header lines the feed parser would end the head at, folded and
duplicate fields, 8-bit bytes, transfer encodings, file names and dispositions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.core.mail import ParseLimits, content
from connectors.core.mail.content import MailContent, extract_content

pytestmark = pytest.mark.unit

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "mail"
LIMITS = ParseLimits()


def _both(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[MailContent, MailContent, bool]:
    fast = extract_content(raw, LIMITS, None)
    took_shortcut = content._single_text_part(raw, LIMITS) is not None
    with monkeypatch.context() as patched:
        patched.setattr(content, "_single_text_part", lambda *_args: None)
        slow = extract_content(raw, LIMITS, None)
    return fast, slow, took_shortcut


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.eml")), ids=lambda p: p.name)
def test_corpus_mails_come_out_the_same(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, _ = _both(path.read_bytes(), monkeypatch)
    assert fast == slow


@pytest.mark.parametrize(
    ("raw", "shortcut"),
    [
        (b"Subject: a\r\n\r\nhello\r\n", True),
        (b"Content-Type: text/html; charset=utf-8\r\n\r\n<p>hi</p>", True),
        (b"Content-Type: text/plain\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n"
         b"caf=C3=A9 =\r\nsoft break\r\n", True),
        (b"Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\naGk=\r\n", False),
        (b"Content-Type: text/plain; name=a.txt\r\n\r\nfile", False),
        (b'Content-Type: text/plain\r\nContent-Disposition: inline; filename=""\r\n\r\nx', True),
        (b"Content-Disposition: attachment\r\n\r\nx", False),
        (b"Content-Type: application/pdf\r\n\r\n%PDF", False),
        (b"Subject: a\r\nnot a field line\r\n\r\nbody", False),
        (b"Subject : spaced name\r\n\r\nbody", False),
        (b"From sender@example.com Sat Jan  1\r\nSubject: mbox\r\n\r\nbody", False),
        (b" continuation first\r\nSubject: a\r\n\r\nbody", False),
        (b"Subject: a\r\n", False),
        (b"Subject: \xe4\xbd\xa0\r\nContent-Type: text/plain; charset=gbk\r\n\r\n\xc4\xe3", True),
        (b"Content-Type: text/plain;\r\n charset=iso-8859-1\r\n\r\ncaf\xe9", True),
        (b"Content-Transfer-Encoding:\r\n quoted-printable\r\n\r\n=41", False),
        (b"Content-Type: text/html\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\nx", True),
        (b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n\r\nx\r\n--b--\r\n", False),
    ],
)  # fmt: skip
def test_edge_cases_agree_and_take_the_expected_path(
    raw: bytes, shortcut: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, slow, took_shortcut = _both(raw, monkeypatch)
    assert took_shortcut is shortcut
    assert fast == slow


_NAMES = st.sampled_from(
    [
        "Content-Type",
        "content-type",
        "Content-Transfer-Encoding",
        "Content-Disposition",
        "Subject",
        "X-Spam",
        "From ",
        "Bad Name",
        "",
    ]
)
_VALUES = st.sampled_from(
    [
        "text/plain",
        "text/html; charset=utf-8",
        "text/plain; charset=gbk",
        "text/plain; name=x.txt",
        "TEXT/PLAIN",
        "text",
        "application/octet-stream",
        "message/rfc822",
        "multipart/alternative; boundary=z",
        "7bit",
        "8BIT",
        "quoted-printable",
        "Quoted-Printable",
        "base64",
        "x-uuencode",
        "inline",
        "attachment",
        "inline; filename=a.txt",
        "",
    ]
)
_FIELD = st.tuples(_NAMES, _VALUES, st.sampled_from(["", "\r\n ", "\r\n\t"]), _VALUES)
_BODY = st.binary(max_size=200) | st.sampled_from(
    [b"=41=42 =\r\nend", b"\xc4\xe3\xba\xc3", b"--z\r\n\r\npart\r\n--z--", b"=ZZ=4", b""]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(_FIELD, max_size=6), body=_BODY, line_end=st.sampled_from(["\r\n", "\n"]))
def test_generated_single_part_mails_agree(
    fields: list[tuple[str, str, str, str]], body: bytes, line_end: str
) -> None:
    head = "".join(
        f"{name}:{value}{fold + more if fold else ''}{line_end}"
        for name, value, fold, more in fields
    )
    raw = (head + line_end).encode("utf-8") + body
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, slow, _ = _both(raw, monkeypatch)
    assert fast == slow
