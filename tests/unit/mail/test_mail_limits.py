"""The pre-scan: caps found and patched before the stdlib parser sees the bytes."""

from __future__ import annotations

from email import policy
from email.message import Message
from email.parser import BytesParser

import pytest

from connectors.core.mail.limits import FLATTEN_FIELDS, ParseLimits, apply_patches, prescan

pytestmark = pytest.mark.unit


def nested_multipart(depth: int, newline: bytes = b"\r\n") -> bytes:
    out = [b"From: a@example.org", b"Subject: deep", b"MIME-Version: 1.0"]
    for level in range(depth):
        out += [b'Content-Type: multipart/mixed; boundary="b%d"' % level, b"", b"--b%d" % level]
    out += [b"Content-Type: text/plain", b"", b"innermost"]
    out += [b"--b%d--" % level for level in reversed(range(depth))]
    return newline.join(out) + newline


def test_depth_is_measured_like_the_stdlib_parser() -> None:
    scan = prescan(nested_multipart(7), ParseLimits())
    assert (scan.max_depth, scan.parts, scan.patches, scan.problems) == (7, 7, [], [])
    scan = prescan(nested_multipart(7, newline=b"\n"), ParseLimits())
    assert scan.max_depth == 7


def test_nesting_beyond_the_cap_is_flattened_into_one_leaf() -> None:
    raw = nested_multipart(12)
    scan = prescan(raw, ParseLimits(max_mime_depth=5))
    assert scan.max_depth == 5
    assert [patch.replacement for patch in scan.patches] == [FLATTEN_FIELDS]
    message = BytesParser(policy=policy.compat32).parsebytes(apply_patches(raw, scan.patches))
    leaf = message
    for _ in range(5):
        payload = leaf.get_payload()
        assert isinstance(payload, list) and isinstance(payload[0], Message)
        leaf = payload[0]
    assert leaf.get_content_type() == "application/octet-stream"
    assert b"innermost" in leaf.get_payload(decode=True)


def test_sibling_parts_do_not_count_as_depth() -> None:
    parts = b"".join(b"--s\r\nContent-Type: text/plain\r\n\r\npart %d\r\n" % i for i in range(300))
    raw = b'Content-Type: multipart/mixed; boundary="s"\r\n\r\n' + parts + b"--s--\r\n"
    scan = prescan(raw, ParseLimits(max_mime_depth=2))
    assert (scan.max_depth, scan.parts, scan.patches) == (1, 300, [])


def test_embedded_messages_count_as_levels() -> None:
    inner = b"Subject: inner\r\nContent-Type: text/plain\r\n\r\nhi\r\n"
    raw = inner
    for _ in range(4):
        raw = b"Subject: wrap\r\nContent-Type: message/rfc822\r\n\r\n" + raw
    assert prescan(raw, ParseLimits()).max_depth == 4
    assert len(prescan(raw, ParseLimits(max_mime_depth=2)).patches) == 1


def test_digest_children_default_to_embedded_messages() -> None:
    raw = (
        b'Content-Type: multipart/digest; boundary="d"\r\n\r\n'
        b"--d\r\n\r\nSubject: embedded\r\n\r\nbody\r\n--d--\r\n"
    )
    assert prescan(raw, ParseLimits()).max_depth == 2


def test_too_many_parts_skips_mime_parsing() -> None:
    parts = b"".join(b"--s\r\n\r\n%d\r\n" % i for i in range(50))
    raw = b'Content-Type: multipart/mixed; boundary="s"\r\n\r\n' + parts + b"--s--\r\n"
    scan = prescan(raw, ParseLimits(max_parts=10))
    assert scan.skip_mime
    assert "more than 10 MIME parts" in scan.problems[0]


def test_long_header_blocks_are_cut_at_a_line() -> None:
    head = b"".join(b"X-Filler-%d: value\r\n" % i for i in range(50))
    raw = b"Subject: kept\r\n" + head + b"\r\nbody\r\n"
    scan = prescan(raw, ParseLimits(max_header_lines=10))
    patched = apply_patches(raw, scan.patches)
    assert patched.count(b"X-Filler") == 9
    assert patched.endswith(b"X-Filler-8: value\r\n\r\nbody\r\n")
    scan = prescan(raw, ParseLimits(max_header_bytes=100))
    assert len(apply_patches(raw, scan.patches).split(b"\r\n\r\n")[0]) <= 100


def test_parameter_lists_are_cut_but_keep_the_boundary() -> None:
    params = "".join(f'; p{i}="v{i}"' for i in range(500))
    raw = (
        f'Content-Type: multipart/mixed{params}; boundary="keep"\r\n\r\n'
        "--keep\r\nContent-Type: text/plain\r\n\r\nhello\r\n--keep--\r\n"
    ).encode()
    scan = prescan(raw, ParseLimits(max_params=20))
    patched = apply_patches(raw, scan.patches)
    head = patched.split(b"\r\n\r\n")[0]
    assert head.count(b";") == 21
    assert head.endswith(b'boundary="keep"')
    assert (scan.max_depth, scan.parts) == (1, 1)


def test_oversized_messages_are_not_mime_parsed() -> None:
    scan = prescan(b"Subject: big\r\n\r\n" + b"x" * 1000, ParseLimits(max_message_bytes=500))
    assert scan.skip_mime
    assert scan.problems == ["message over 500 bytes; headers only"]


def test_part_heads_have_their_own_smaller_caps() -> None:
    part_head = b"".join(b"X-%d: v\r\n" % i for i in range(50))
    raw = (
        b'Content-Type: multipart/mixed; boundary="s"\r\n' + part_head + b"\r\n"
        b"--s\r\nContent-Type: text/plain\r\n" + part_head + b"\r\nbody\r\n--s--\r\n"
    )
    scan = prescan(raw, ParseLimits(max_part_header_lines=10))
    patched = apply_patches(raw, scan.patches)
    assert patched.count(b"X-49: v") == 1  # the top-level head keeps all 50
    assert patched.count(b"X-8: v") == 2 and patched.count(b"X-9: v") == 1
    assert scan.problems == ["header block over 10 lines or 16384 bytes; cut"]


def test_rfc2231_boundaries_are_followed_like_the_stdlib_does() -> None:
    # compat32 joins boundary*0/boundary*1*; a pre-scan that missed it would undercount depth.
    out = [b"Subject: x"]
    for level in range(10):
        out += [
            b'Content-Type: multipart/mixed; boundary*0="b%d"; boundary*1*=%%41' % level,
            b"",
            b"--b%dA" % level,
        ]
    raw = b"\r\n".join([*out, b"Content-Type: text/plain", b"", b"x"])
    message = BytesParser(policy=policy.compat32).parsebytes(raw)
    depth = 0
    while isinstance(payload := message.get_payload(), list):
        depth += 1
        assert isinstance(payload[0], Message)
        message = payload[0]
    assert depth == 10
    assert prescan(raw, ParseLimits()).max_depth == 10
