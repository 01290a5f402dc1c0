"""The readable text of a MIME subtree flattened at the depth cap (:mod:`.limits`).

A subtree nested deeper than ``max_mime_depth`` is one opaque leaf for the stdlib parser, so its
text parts would be lost from ``text_body``. This module reads them back without the stdlib
parser and without recursion: one pass over the lines, with the set of boundaries declared so
far. A line ``--<boundary>`` of a known boundary starts a part head; a head declaring a
multipart adds its boundary; the body of a ``text/plain`` or ``text/html`` part that is not an
attachment (no file name, no ``Content-Disposition: attachment``) runs to the next delimiter
line and is decoded (base64, quoted-printable, or as is). Nothing else of the subtree is read:
embedded messages are not this mail's body (as in :mod:`.content`), and attachments below the
cap stay in the raw MIME.

Wire sample (the flattened leaf's head, then its body)::

    Content-Type: application/octet-stream           <- inserted by the pre-scan
    X-Mailtap-Flattened: mime-depth                   <- inserted by the pre-scan
    Content-Type: multipart/mixed; boundary="b51"    <- the subtree's own type

    --b51
    Content-Type: text/plain; charset=utf-8

    the text, read back here
    --b51--

Cost: linear in the subtree's bytes; a part head is read up to ``max_part_header_lines``.
"""

from __future__ import annotations

import base64
import binascii
import quopri
import re

from connectors.core.mail.limits import ParseLimits
from connectors.core.mail.params import content_type_of, param_value, parse_params

__all__ = ["MARKER", "TextPart", "text_parts"]

#: The field the pre-scan puts into the head of a flattened subtree (limits.FLATTEN_FIELDS).
MARKER = ("x-mailtap-flattened", "mime-depth")

TextPart = tuple[str, list[tuple[str, str]], bytes]
"""``(content type, its parameters, decoded body)`` of one text part."""

_BODY_TYPES = ("text/plain", "text/html")
_FIELD = re.compile(rb"([\041-\071\073-\176]+)[ \t]*:(.*)")


def text_parts(own_types: list[str], body: bytes, limits: ParseLimits) -> list[TextPart]:
    """The body text parts of a flattened subtree. ``own_types`` are the Content-Type values
    of the flattened leaf's head (the inserted one and the subtree's own), ``body`` its body."""
    boundaries: set[bytes] = set()
    for value in own_types:
        _add_boundary(value, boundaries, limits)
    found: list[TextPart] = []
    lines = body.split(b"\n")
    index = 0
    current: tuple[str, list[tuple[str, str]], str] | None = None  # a text part being read
    start = 0
    while index < len(lines):
        line = lines[index].rstrip(b"\r")
        delimiter = _delimiter(line, boundaries) if line.startswith(b"--") else None
        if delimiter is None:
            index += 1
            continue
        if current is not None and index > start:
            found.append(_decoded(current, lines[start:index]))
        if delimiter == "close":  # the epilogue up to the next delimiter is no part
            current, index = None, index + 1
            continue
        current, index = _read_head(lines, index + 1, boundaries, limits)
        start = index
    if current is not None and start < len(lines):
        found.append(_decoded(current, lines[start:]))
    return found


def _delimiter(line: bytes, boundaries: set[bytes]) -> str | None:
    """``"open"`` for ``--<boundary>``, ``"close"`` for ``--<boundary>--`` of a known boundary."""
    rest = line[2:].rstrip(b" \t")
    if rest in boundaries:
        return "open"
    if rest.endswith(b"--") and rest[:-2] in boundaries:
        return "close"
    return None


def _read_head(
    lines: list[bytes], index: int, boundaries: set[bytes], limits: ParseLimits
) -> tuple[tuple[str, list[tuple[str, str]], str] | None, int]:
    """Read a part head from ``lines[index]``; returns the part if it is body text (its type,
    parameters, transfer encoding) and the index of its first body line."""
    fields: dict[str, str] = {}
    name = ""
    read = 0
    while index < len(lines):
        line = lines[index].rstrip(b"\r")
        if line.startswith(b"--") and _delimiter(line, boundaries):
            return None, index  # a part without head end or body: the delimiter is read next
        index += 1
        if not line:
            break
        read += 1
        if read > limits.max_part_header_lines:
            continue  # an oversized head: skip to its end, keep what was read
        if line[:1] in (b" ", b"\t") and name:
            fields[name] += " " + line.strip().decode("ascii", "surrogateescape")
            continue
        match = _FIELD.match(line)
        name = match[1].decode("ascii").lower() if match else ""
        if match and name not in fields:  # the first field wins, as in the stdlib parser
            fields[name] = match[2].strip().decode("ascii", "surrogateescape")
    ctype_value = fields.get("content-type")
    if ctype_value is not None:
        _add_boundary(ctype_value, boundaries, limits)
    ctype = content_type_of(ctype_value)
    if ctype not in _BODY_TYPES:
        return None, index
    _, params = parse_params(ctype_value or "", limits.max_params)
    disposition, disposition_params = parse_params(
        fields.get("content-disposition", ""), limits.max_params
    )
    filename = param_value(disposition_params, "filename") or param_value(params, "name")
    if disposition == "attachment" or filename is not None:
        return None, index
    return (ctype, params, fields.get("content-transfer-encoding", "").lower()), index


def _add_boundary(value: str, boundaries: set[bytes], limits: ParseLimits) -> None:
    main, params = parse_params(value, limits.max_params)
    if main.startswith("multipart/"):
        boundary = param_value(params, "boundary")
        if boundary:
            boundaries.add(boundary.encode("utf-8", "surrogateescape"))


def _decoded(part: tuple[str, list[tuple[str, str]], str], lines: list[bytes]) -> TextPart:
    ctype, params, encoding = part
    # The line break before a delimiter belongs to the delimiter (RFC 2046 section 5.1.1).
    data = b"\n".join(lines).removesuffix(b"\n").removesuffix(b"\r")
    if encoding == "base64":
        try:
            data = base64.b64decode(b"".join(data.split()), validate=False)
        except (binascii.Error, ValueError):
            data = b""
    elif encoding == "quoted-printable":
        data = quopri.decodestring(data)
    return ctype, params, data
