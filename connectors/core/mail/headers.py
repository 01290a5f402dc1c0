"""Raw header block handling at the byte level: split head from body, unfold fields.

Kept apart from the stdlib ``email`` package on purpose: these functions are linear in the
input, never decode, and are used on untrusted bytes *before* any MIME parsing (caps,
fingerprints, top-level fields).

Wire sample::

    Received: from mx.example.net\r\n
    \tby mail.example.com; Mon, 2 Dec 2024 10:00:00 +0000\r\n
    Subject: hello\r\n
    \r\n
    body

>>> head, body = split_head(b"Subject: a\\r\\n b\\r\\nX: 1\\r\\n\\r\\nbody")
>>> parse_fields(head)
[('Subject', b'a b'), ('X', b'1')]
>>> body
b'body'
"""

from __future__ import annotations

import re

__all__ = ["parse_fields", "split_head"]

# The head ends at the first empty line. Bare CR is not treated as a line end here: it is
# rare, and accepting it makes "\r\n" ambiguous.
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")


def split_head(raw: bytes) -> tuple[bytes, bytes]:
    """Split a message into its header block (without the empty line) and its body."""
    if raw.startswith((b"\r\n", b"\n")):
        return b"", raw[2 if raw.startswith(b"\r\n") else 1 :]
    match = _HEAD_END.search(raw)
    if match is None:
        return raw, b""
    # Keep the line end of the last header line out of the head.
    end_of_last_line = match.start()
    return raw[:end_of_last_line], raw[match.end() :]


def parse_fields(head: bytes) -> list[tuple[str, bytes]]:
    """Header fields in order, as ``(name, unfolded raw value)``.

    Unfolding follows RFC 5322 section 2.2.3: the line break before a continuation line is
    removed, its leading white space kept. Leading white space after the colon is dropped.
    Lines that are neither a field nor a continuation (an mbox ``From `` line, garbage) are
    skipped.
    """
    fields: list[tuple[str, list[bytes]]] = []
    for line in _LINE_END.split(head):
        if line[:1] in (b" ", b"\t"):
            if fields:
                fields[-1][1].append(line)
            continue
        name, colon, value = line.partition(b":")
        name = name.rstrip(b" \t")
        if not colon or not name or b" " in name:
            continue
        fields.append((name.decode("latin-1"), [value.lstrip(b" \t")]))
    return [(name, b"".join(chunks).rstrip(b"\r")) for name, chunks in fields]
