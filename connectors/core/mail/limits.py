"""Caps on untrusted MIME, applied by a cheap pre-scan *before* the stdlib parser runs.

The stdlib ``email`` parser recurses once per MIME level (1,000 nested multiparts raise
RecursionError) and its parameter handling is quadratic. :func:`prescan` walks the raw bytes
once, without recursion, tracking multipart boundaries the way the stdlib feed parser does,
and returns byte patches that make the message safe to parse:

- a header block (top level or of a part) longer than ``max_header_bytes`` or
  ``max_header_lines`` is cut at a line boundary;
- a ``Content-Type``/``Content-Disposition`` with more than ``max_params`` parameters is
  rewritten with the first ``max_params`` (plus ``boundary``, which the structure needs);
- a multipart or ``message/*`` part that would nest deeper than ``max_mime_depth`` is
  *flattened*: a ``Content-Type: application/octet-stream`` field is put in front of its
  headers, so the parser keeps the whole subtree as one opaque leaf (the first Content-Type
  field wins in the stdlib parser). The subtree stays available in the raw MIME.

Header-derived event fields are bounded by the header block cap; the whole event by
``max_event_bytes`` (enforced in ``budget.py``). The stdlib parser's cost is lines x open MIME
levels, so a mail whose lines x (depth + 1) exceeds ``max_parse_work`` is flattened at a lower
depth. A message larger than
``max_message_bytes``, with more than ``max_parts`` parts, or with more lines than
``max_parse_work`` is not MIME-parsed at all (``Prescan.skip_mime``): its event carries the
top-level headers only.

Wire sample of a flattened part at the depth cap::

    --b50\r\n
    Content-Type: application/octet-stream\r\n          <- inserted
    X-Mailtap-Flattened: mime-depth\r\n                  <- inserted
    Content-Type: multipart/mixed; boundary="b51"\r\n
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from connectors.core.mail.params import content_type_of, parse_params, rfc2231_bytes, split_params

__all__ = ["FLATTEN_FIELDS", "ParseLimits", "Patch", "Prescan", "apply_patches", "prescan"]

FLATTEN_FIELDS = b"Content-Type: application/octet-stream\r\nX-Mailtap-Flattened: mime-depth\r\n"


@dataclass(frozen=True, slots=True)
class ParseLimits:
    """Caps for one mail. Defaults keep a ``MailEvent`` well under Kafka's 1 MB record limit."""

    #: Larger mails are not MIME-parsed (headers only); the raw MIME still goes to the
    #: claim-check store. 64 MiB is above what common servers accept (often 25-50 MB).
    max_message_bytes: int = 64 * 1024 * 1024
    #: Per header block. 2.5x Postfix's ``header_size_limit`` default (102400), so that a
    #: subject of thousands of folded encoded words still arrives whole.
    max_header_bytes: int = 256 * 1024
    #: Per header block; a real top-level head with a long Received chain has ~100 lines,
    #: a subject folded into one encoded word per line can have thousands.
    max_header_lines: int = 10_000
    #: Per MIME part head (Content-Type, -Disposition, -Transfer-Encoding, -ID: a handful of
    #: lines in real mail). Message heads (top level, message/rfc822) use the caps above.
    max_part_header_lines: int = 200
    max_part_header_bytes: int = 16 * 1024
    #: MIME nesting (multipart and message/* levels). The stdlib parser needs a few stack
    #: frames per level and fails at ~250 here; Postfix's ``mime_nesting_limit`` is 100.
    max_mime_depth: int = 50
    #: Parameters per Content-Type/Content-Disposition (real mail: < 10, RFC 2231
    #: continuations of a long file name: a few dozen).
    max_params: int = 100
    #: MIME parts (boundary lines); beyond this the mail is not MIME-parsed.
    max_parts: int = 2_000
    #: Lines x (MIME depth + 1): the stdlib parser tests every line against every open
    #: boundary, ~90 ns each here, so 16 M is ~1.5 s. Over it, the depth cap is lowered for
    #: this mail; a mail with more lines than this is not MIME-parsed.
    max_parse_work: int = 16_000_000
    #: UTF-8 bytes kept of ``text_body`` and of ``html_body`` each.
    max_body_bytes: int = 128 * 1024
    #: Attachment entries listed in the event.
    max_attachments: int = 500
    #: Budget for the whole event (approximate encoded size). Kafka's default record limit is
    #: 1 MiB; an event over budget loses its bodies first, then long lists are cut.
    max_event_bytes: int = 768 * 1024


@dataclass(frozen=True, slots=True)
class Patch:
    """Replace ``raw[start:end]`` with ``replacement``."""

    start: int
    end: int
    replacement: bytes


@dataclass(slots=True)
class Prescan:
    patches: list[Patch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    max_depth: int = 0
    parts: int = 0
    skip_mime: bool = False


@dataclass(slots=True)
class _Level:
    boundary: bytes | None  # None: an embedded message/* level
    child_default: str


@dataclass(slots=True)
class _Field:
    name: bytes  # as written
    start: int
    end: int  # end of the field's last line, before its line break
    value: bytearray


_DASH_LINE = re.compile(rb"^--", re.MULTILINE)
_EMPTY_LINE = re.compile(rb"\n(\r?\n)")


def prescan(raw: bytes, limits: ParseLimits) -> Prescan:
    """Depth, part count, and the patches that enforce the caps (including the work cap)."""
    result = _prescan(raw, limits)
    if result.skip_mime:
        return result
    if (len(raw) + 1) * (result.max_depth + 1) <= limits.max_parse_work:
        return result  # no need to count lines: there are at most len(raw) + 1
    lines = raw.count(b"\n") + 1
    if lines * (result.max_depth + 1) <= limits.max_parse_work:
        return result
    allowed_depth = limits.max_parse_work // lines - 1
    if allowed_depth < 1:
        _problem(result, f"{lines} lines, too many to MIME-parse; headers only")
        result.skip_mime = True
        return result
    reduced = _prescan(raw, replace(limits, max_mime_depth=allowed_depth))
    reduced.problems.insert(0, f"{lines} lines: MIME depth cap lowered to {allowed_depth}")
    return reduced


def _prescan(raw: bytes, limits: ParseLimits) -> Prescan:
    """One linear pass over ``raw``."""
    result = Prescan()
    if len(raw) > limits.max_message_bytes:
        _problem(result, f"message over {limits.max_message_bytes} bytes; headers only")
        result.skip_mime = True
        _scan_head(raw, 0, limits.max_header_lines, limits.max_header_bytes, result)
        return result
    stack: list[_Level] = []
    boundaries: dict[bytes, int] = {}  # boundary -> innermost open level using it
    default_type = "text/plain"
    in_head = True
    part_head = False  # a MIME part's head, not a message's (top level or message/*)
    pos = 0
    while pos <= len(raw):
        if in_head:
            head_start = pos
            if part_head:
                caps = (limits.max_part_header_lines, limits.max_part_header_bytes)
            else:
                caps = (limits.max_header_lines, limits.max_header_bytes)
            fields, pos = _scan_head(raw, pos, *caps, result)
            ctype = _cap_params_and_type(fields, default_type, limits, result)
            level: _Level | None = None
            if ctype.startswith("multipart/"):
                boundary = _boundary_of(fields, limits)
                if boundary:
                    child = "message/rfc822" if ctype == "multipart/digest" else "text/plain"
                    level = _Level(boundary, child)
            elif ctype.startswith("message/") and ctype != "message/delivery-status":
                level = _Level(None, "text/plain")
            if level is not None and len(stack) >= limits.max_mime_depth:
                result.patches.append(Patch(head_start, head_start, FLATTEN_FIELDS))
                _problem(result, f"MIME nesting deeper than {limits.max_mime_depth}; flattened")
                level = None
            if level is not None:
                stack.append(level)
                boundaries = _index(stack)
                result.max_depth = max(result.max_depth, len(stack))
            # An embedded message starts with its own head right away.
            in_head = level is not None and level.boundary is None
            part_head = False
            default_type = "text/plain"
            continue
        if not stack:
            break  # a leaf body, or the epilogue of the outermost multipart
        match = _DASH_LINE.search(raw, pos)
        if match is None:
            break
        end, pos = _line_at(raw, match.start())
        hit = _match_boundary(raw[match.start() + 2 : end], boundaries)
        if hit is None:
            continue
        index, closing = hit
        del stack[index if closing else index + 1 :]
        boundaries = _index(stack)
        if closing:
            continue
        result.parts += 1
        if result.parts > limits.max_parts:
            _problem(result, f"more than {limits.max_parts} MIME parts; headers only")
            result.skip_mime = True
            return result
        default_type = stack[index].child_default
        in_head = part_head = True
    return result


def apply_patches(raw: bytes, patches: list[Patch]) -> bytes:
    """``raw`` with the patches applied (they never overlap; order does not matter)."""
    if not patches:
        return raw
    out: list[bytes] = []
    pos = 0
    for patch in sorted(patches, key=lambda p: (p.start, p.end)):
        out.append(raw[pos : patch.start])
        out.append(patch.replacement)
        pos = max(pos, patch.end)
    out.append(raw[pos:])
    return b"".join(out)


def _problem(result: Prescan, text: str) -> None:
    if text not in result.problems:
        result.problems.append(text)


def _line_at(raw: bytes, pos: int) -> tuple[int, int]:
    """``(end of the line's content, start of the next line)`` for LF or CRLF line ends."""
    newline = raw.find(b"\n", pos)
    if newline == -1:
        return len(raw), len(raw) + 1
    end = newline - 1 if newline > pos and raw[newline - 1] == 0x0D else newline
    return end, newline + 1


#: The fields the pre-scan reads (:func:`_first` looks for nothing else).
_PRESCAN_FIELDS = frozenset({b"content-type", b"content-disposition"})


def _scan_head(
    raw: bytes, pos: int, max_lines: int, max_bytes: int, result: Prescan
) -> tuple[list[_Field], int]:
    """Read one header block starting at ``pos``; returns its fields (at least the
    Content-Type and Content-Disposition ones) and where its body starts.

    Lines beyond the caps are removed by a patch; the rest of the block is skipped by a regex
    search, not line by line.
    """
    quick = _scan_head_within_caps(raw, pos, max_lines, max_bytes)
    if quick is not None:
        return quick
    return _scan_head_by_line(raw, pos, max_lines, max_bytes, result)


def _scan_head_within_caps(
    raw: bytes, pos: int, max_lines: int, max_bytes: int
) -> tuple[list[_Field], int] | None:
    """:func:`_scan_head_by_line` for the common block: one that ends with an empty line,
    within the caps; only the fields in ``_PRESCAN_FIELDS`` are returned. None for any
    other block (then nothing was changed).

    The block ends before the first empty line (``\\n`` or ``\\r\\n``) after a non-empty
    one: at the first LF that is followed by ``\\r?\\n``. Its lines are then split at C speed.
    """
    if raw.startswith((b"\n", b"\r\n"), pos):
        return None  # an empty head: the line loop is as quick
    # A block ending past the byte cap goes to the line loop anyway, so the searches stop
    # there (unbounded, each part head of a big mail would search to its end).
    limit = min(len(raw), pos + max_bytes + 3)
    first_newline = raw.find(b"\n", pos, limit)
    if first_newline > pos and raw[first_newline - 1] == 0x0D:
        crlf = raw.find(b"\n\r\n", pos, limit)
        lf = raw.find(b"\n\n", pos, limit if crlf < 0 else crlf + 3)
    else:
        lf = raw.find(b"\n\n", pos, limit)
        crlf = raw.find(b"\n\r\n", pos, limit if lf < 0 else lf + 2)
    if lf >= 0 and (crlf < 0 or lf < crlf):
        last_newline, body_start = lf, lf + 2
    elif crlf >= 0:
        last_newline, body_start = crlf, crlf + 3
    else:
        return None
    # The line loop cuts when a line's count or its end passes a cap; ends are <= last_newline.
    if last_newline - pos > max_bytes or raw.count(b"\n", pos, last_newline + 1) > max_lines:
        return None
    # Only lines that mention "content-" can hold a wanted field: find those at C speed.
    block = raw[pos:last_newline]  # every line in it is followed by an LF
    lowered = block.lower()
    fields: list[_Field] = []
    hit = lowered.find(b"content-")
    while hit >= 0:
        _read_wanted_field(block, pos, block.rfind(b"\n", 0, hit) + 1, fields)
        # On from the next line: each line is looked back over once (linear).
        line_end = block.find(b"\n", hit)
        hit = -1 if line_end < 0 else lowered.find(b"content-", line_end + 1)
    return fields, body_start


def _line_in(block: bytes, start: int) -> tuple[int, int]:
    """``(end of the line's content, end of the line)`` for a line of ``block``."""
    line_end = block.find(b"\n", start)
    if line_end == -1:
        line_end = len(block)
    if line_end > start and block[line_end - 1] == 0x0D:
        return line_end - 1, line_end
    return line_end, line_end


def _read_wanted_field(block: bytes, offset: int, start: int, fields: list[_Field]) -> None:
    """Append the field on the line at ``start`` when it is one of ``_PRESCAN_FIELDS``,
    unfolded as the line loop does it: continuation lines extend it, lines that are not
    fields are skipped, the next field ends it."""
    if block[start : start + 1] in (b" ", b"\t"):
        return
    end, line_end = _line_in(block, start)
    colon = block.find(b":", start, end)
    if colon <= start or block[start:colon].strip().lower() not in _PRESCAN_FIELDS:
        return
    value = bytearray(block[colon + 1 : end].lstrip(b" \t"))
    found = _Field(block[start:colon], offset + start, offset + end, value)
    fields.append(found)
    while line_end < len(block):
        start = line_end + 1
        end, line_end = _line_in(block, start)
        if block[start : start + 1] in (b" ", b"\t"):
            found.value += block[start:end]
            found.end = offset + end
        elif block.find(b":", start, end) > start:
            return


def _scan_head_by_line(
    raw: bytes, pos: int, max_lines: int, max_bytes: int, result: Prescan
) -> tuple[list[_Field], int]:
    """:func:`_scan_head` for any block, line by line."""
    head_start = pos
    fields: list[_Field] = []
    lines = 0
    while pos < len(raw):
        end, next_pos = _line_at(raw, pos)
        if end == pos:  # the empty line that ends the head
            return fields, next_pos
        lines += 1
        if lines > max_lines or end - head_start > max_bytes:
            _problem(result, f"header block over {max_lines} lines or {max_bytes} bytes; cut")
            empty = _EMPTY_LINE.search(raw, pos)
            head_end = empty.start(1) if empty else len(raw)
            result.patches.append(Patch(pos, head_end, b""))
            return fields, empty.end() if empty else len(raw) + 1
        if raw[pos] in (0x20, 0x09):
            if fields:
                fields[-1].value += raw[pos:end]
                fields[-1].end = end
        else:
            colon = raw.find(b":", pos, end)
            if colon > pos:
                value = bytearray(raw[colon + 1 : end].lstrip(b" \t"))
                fields.append(_Field(raw[pos:colon], pos, end, value))
        pos = next_pos
    return fields, pos


def _first(fields: list[_Field], name: bytes) -> _Field | None:
    for candidate in fields:
        if candidate.name.strip().lower() == name:
            return candidate
    return None


def _cap_params_and_type(
    fields: list[_Field], default_type: str, limits: ParseLimits, result: Prescan
) -> str:
    """Rewrite over-long parameter lists; return the part's media type."""
    for name in (b"content-type", b"content-disposition"):
        found = _first(fields, name)
        if found is None or found.value.count(b";") <= limits.max_params:
            continue  # at most one more piece than separators: nothing to cut
        pieces = split_params(found.value.decode("latin-1"))
        if len(pieces) - 1 <= limits.max_params:
            continue
        kept = [piece.strip() for piece in pieces[1 : limits.max_params + 1]]
        kept += [
            piece.strip()
            for piece in pieces[limits.max_params + 1 :]
            if piece.strip().lower().startswith("boundary")
        ]
        rebuilt = "; ".join([pieces[0].strip(), *kept]).encode("latin-1")
        result.patches.append(Patch(found.start, found.end, found.name + b": " + rebuilt))
        found.value = bytearray(rebuilt)
        _problem(result, f"more than {limits.max_params} header parameters; cut")
    ctype = _first(fields, b"content-type")
    if ctype is None:
        return default_type
    return content_type_of(ctype.value.decode("latin-1"), default_type)


def _boundary_of(fields: list[_Field], limits: ParseLimits) -> bytes | None:
    """The boundary as the stdlib's compat32 parser finds it: the plain parameter first,
    else the RFC 2231 form (``boundary*0=...``), unquoted, trailing white space dropped."""
    ctype = _first(fields, b"content-type")
    if ctype is None:
        return None
    # + 1: a capped list keeps ``boundary`` after its first max_params parameters.
    _, params = parse_params(ctype.value.decode("latin-1"), limits.max_params + 1)
    for name, value in params:
        if name == "boundary":
            return value.rstrip().encode("latin-1") or None
    joined = rfc2231_bytes(params, "boundary", lambda text: text.encode("latin-1"))
    return joined[1].rstrip() or None if joined is not None else None


def _index(stack: list[_Level]) -> dict[bytes, int]:
    return {level.boundary: i for i, level in enumerate(stack) if level.boundary is not None}


def _match_boundary(line: bytes, boundaries: dict[bytes, int]) -> tuple[int, bool] | None:
    """Which open level a ``--...`` line continues or closes.

    The stdlib matches ``--boundary(--)?[ \t]*`` against every open level, innermost first;
    two dictionary lookups give the same answer without a loop over the levels (a body of
    millions of ``--`` lines under 50 levels made the loop cost seconds).
    """
    rest = line.rstrip(b" \t")
    plain = boundaries.get(rest)
    closing = boundaries.get(rest[:-2]) if rest.endswith(b"--") else None
    if plain is None and closing is None:
        return None
    if closing is None or (plain is not None and plain > closing):
        assert plain is not None
        return plain, False
    return closing, True
