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
from dataclasses import dataclass

__all__ = ["Head", "parse_fields", "read_head", "split_head", "split_lines"]

# The head ends at the first empty line. Bare CR is not treated as a line end here: it is
# rare, and accepting it makes "\r\n" ambiguous.
_HEAD_END = re.compile(rb"\r?\n\r?\n")
#: Where the end of the head is looked for with bytes.find() first (C speed, a few times
#: faster than the regex); a head that does not end within it takes the regex.
_HEAD_WINDOW = 16 * 1024


#: A header line every reader agrees on: a name of printable characters (no space, no colon)
#: right before the colon, no CR but the one before the line end. When every line of a block
#: is one, the block has no folds and no garbage, and one regex pass reads all its fields.
#: The value starts at its first character that is not blank, so that the blanks before it
#: are split off one way only (``[ \t]*[^\r\n]*`` backtracks quadratically on a line of
#: blanks that does not match).
_PLAIN_FIELD = re.compile(
    rb"^([\041-\071\073-\176]+):[ \t]*((?:[^ \t\r\n][^\r\n]*)?)\r?$", re.MULTILINE
)


@dataclass(frozen=True, slots=True)
class Head:
    """A message split at its first empty line, for readers that need more than one view."""

    head: bytes
    body: bytes
    #: Every line of ``head`` is a plain ``Name: value`` line (see ``_PLAIN_FIELD``).
    plain: bool
    #: The values of :func:`parse_fields` by lower-cased name (``str.lower``), in order.
    by_name: dict[str, list[bytes]]


def read_head(raw: bytes) -> Head:
    """:func:`split_head`, and :func:`parse_fields` grouped by name, in one go."""
    head, body = split_head(raw)
    by_name: dict[str, list[bytes]] = {}
    found = _PLAIN_FIELD.findall(head)
    plain = len(found) == head.count(b"\n") + 1
    if plain:
        # Plain names are ASCII: bytes.lower() is what str.lower() does to them.
        pairs = [(name.lower().decode("ascii"), value) for name, value in found]
    else:
        pairs = [(name.lower(), value) for name, value in _fields_of(split_lines(head))]
    for lowered, value in pairs:
        same_name = by_name.get(lowered)
        if same_name is None:
            by_name[lowered] = [value]
        else:
            same_name.append(value)
    return Head(head, body, plain, by_name)


def _plain_fields(head: bytes) -> list[tuple[str, bytes]] | None:
    """:func:`parse_fields` of a block of plain field lines only, else None. Each match is
    one whole line, so as many matches as lines means every line is plain; such a line's
    name needs no strip and its value is the rest after the colon's white space."""
    found = _PLAIN_FIELD.findall(head)
    if len(found) != head.count(b"\n") + 1:
        return None
    return [(name.decode("latin-1"), value) for name, value in found]


def split_head(raw: bytes) -> tuple[bytes, bytes]:
    """Split a message into its header block (without the empty line) and its body."""
    if raw.startswith((b"\r\n", b"\n")):
        return b"", raw[2 if raw.startswith(b"\r\n") else 1 :]
    bounds = _head_end(raw)
    if bounds is None:
        return raw, b""
    # Keep the line end of the last header line out of the head.
    end_of_last_line, start_of_body = bounds
    return raw[:end_of_last_line], raw[start_of_body:]


def _head_end(raw: bytes) -> tuple[int, int] | None:
    """Start and end of the first ``\\r?\\n\\r?\\n`` in ``raw``, as ``_HEAD_END.search`` finds it.

    That match begins at (or one CR before) the first LF followed by ``\\r?\\n``: the
    earliest ``\\n\\n`` or ``\\n\\r\\n``. Looked for in a window first; an occurrence
    before one found in the window lies in the window too.
    """
    window = min(len(raw), _HEAD_WINDOW)
    # The line end style of the first line goes first; the other search then stops where
    # the first one hit (a find that runs through the whole window costs more than the regex).
    first_newline = raw.find(b"\n", 0, window)
    if first_newline > 0 and raw[first_newline - 1] == 0x0D:
        crlf = raw.find(b"\n\r\n", 0, window)
        lf = raw.find(b"\n\n", 0, window if crlf < 0 else crlf + 3)
    else:
        lf = raw.find(b"\n\n", 0, window)
        crlf = raw.find(b"\n\r\n", 0, window if lf < 0 else lf + 2)
    if lf >= 0 and (crlf < 0 or lf < crlf):
        newline, end = lf, lf + 2
    elif crlf >= 0:
        newline, end = crlf, crlf + 3
    else:
        match = _HEAD_END.search(raw, max(0, window - 3))
        return None if match is None else (match.start(), match.end())
    start = newline - 1 if newline and raw[newline - 1] == 0x0D else newline
    return start, end


def split_lines(head: bytes) -> list[bytes]:
    """Lines of a header block, split at LF or CRLF (a CR elsewhere stays in its line).

    The same as ``re.split(rb"\\r?\\n", head)``, at C speed.
    """
    return head.replace(b"\r\n", b"\n").split(b"\n")


def parse_fields(head: bytes) -> list[tuple[str, bytes]]:
    """Header fields in order, as ``(name, unfolded raw value)``.

    Unfolding follows RFC 5322 section 2.2.3: the line break before a continuation line is
    removed, its leading white space kept. Leading white space after the colon is dropped.
    Lines that are neither a field nor a continuation (an mbox ``From `` line, garbage) are
    skipped.
    """
    plain = _plain_fields(head)
    return plain if plain is not None else _fields_of(split_lines(head))


def _fields_of(lines: list[bytes]) -> list[tuple[str, bytes]]:
    names: list[str] = []
    # A field's value, or the chunks of a folded one (a list only once a fold occurs).
    values: list[bytes | list[bytes]] = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            if values:
                last = values[-1]
                if isinstance(last, list):
                    last.append(line)
                else:
                    values[-1] = [last, line]
            continue
        name, colon, value = line.partition(b":")
        name = name.rstrip(b" \t")
        if not colon or not name or b" " in name:
            continue
        names.append(name.decode("latin-1"))
        values.append(value.lstrip(b" \t"))
    return [
        (name, (b"".join(value) if isinstance(value, list) else value).rstrip(b"\r"))
        for name, value in zip(names, values, strict=True)
    ]
