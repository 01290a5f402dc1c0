"""MIME header parameters (Content-Type, Content-Disposition), RFC 2045 + RFC 2231.

Linear and bounded: parameters are split by one scan that honours quoted strings, and only
the first ``max_params`` are kept (the stdlib's parameter parser slices the string once per
parameter, which is quadratic; a 20,000-parameter header cost seconds). RFC 2231
continuations (``name*0*=``, ``name*1=``) are joined and percent-decoded in the declared
charset, with the same fallbacks as every other header text.

Wire sample::

    Content-Disposition: attachment;
     filename*0*=UTF-8''%E6%8A%A5%E4%BB%B7;
     filename*1=".pdf"

>>> ctype, params = parse_params('text/plain; charset="utf-8"; format=flowed')
>>> ctype, params
('text/plain', [('charset', 'utf-8'), ('format', 'flowed')])
>>> param_value(parse_params("attachment; filename*0*=UTF-8''%E6%8A%A5%E4%BB%B7; "
...                          'filename*1=".pdf"')[1], "filename")
'报价.pdf'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

from connectors.core.mail.charsets import decode_text
from connectors.core.mail.encodedwords import decode_words

__all__ = ["content_type_of", "param_value", "parse_params", "rfc2231_bytes", "split_params"]

_SECTION = re.compile(r"^(?P<name>[^*]+)\*(?P<index>\d+)?(?P<extended>\*)?$")


def _split_unquoted(value: str, limit: int) -> list[str]:
    """Split on ';' outside quoted strings; stop after ``limit`` pieces (rest dropped)."""
    if '"' not in value:  # the common case, at C speed
        return value.split(";", limit + 1)[: limit + 1]
    pieces: list[str] = []
    current: list[str] = []
    in_quotes = False
    escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\" and in_quotes:
            escaped = True
        elif char == '"':
            in_quotes = not in_quotes
        elif char == ";" and not in_quotes:
            pieces.append("".join(current))
            current = []
            if len(pieces) > limit:
                return pieces
            continue
        current.append(char)
    pieces.append("".join(current))
    return pieces


def split_params(value: str) -> list[str]:
    """The raw ';'-separated pieces of a header value (main value first), quotes honoured."""
    return _split_unquoted(value, limit=1 << 62)


def parse_params(value: str, max_params: int = 100) -> tuple[str, list[tuple[str, str]]]:
    """``(main value lower-cased, [(param name lower-cased, raw value unquoted)])``."""
    pieces = _split_unquoted(value, limit=max_params)
    main = pieces[0].strip().lower()
    params: list[tuple[str, str]] = []
    for piece in pieces[1 : max_params + 1]:
        name, equals, raw = piece.partition("=")
        name = name.strip().lower()
        if not equals or not name:
            continue
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == '"' and raw[-1] == '"':
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        params.append((name, raw))
    return main, params


def content_type_of(value: str | None, default: str = "text/plain") -> str:
    """The media type as the stdlib's compat32 parser sees it (``type/subtype`` or default)."""
    if value is None:
        return default
    main = value.split(";", 1)[0].strip().lower()
    return main if main.count("/") == 1 else "text/plain"


def param_value(params: list[tuple[str, str]], wanted: str) -> str | None:
    """A parameter's decoded value: RFC 2231 form wins over the plain one, which may carry
    RFC 2047 encoded words (non-standard, but what many mailers send for file names)."""
    plain: str | None = None
    sections = False  # any RFC 2231 section (a "*" in a name) at all
    for name, raw in params:
        if plain is None and name == wanted:
            plain = raw
        if "*" in name:
            sections = True
    if sections:
        joined = rfc2231_bytes(params, wanted, _surrogate_bytes)
        if joined is not None:
            return decode_text(joined[1], joined[0])
    if plain is None:
        return None
    if "=?" in plain:
        return decode_words(plain)
    if plain.isascii() and "\x1b$" not in plain:
        return plain  # what decode_text gives for its ASCII bytes
    return decode_text(_surrogate_bytes(plain), None)


def rfc2231_bytes(
    params: list[tuple[str, str]], wanted: str, to_bytes: Callable[[str], bytes]
) -> tuple[str | None, bytes] | None:
    """``(charset, bytes)`` of an RFC 2231 parameter (``name*``, ``name*0*``...), sections
    joined and percent-decoded, or None when the parameter has no RFC 2231 form."""
    sections: dict[int, tuple[str, bool]] = {}
    for name, raw in params:
        if "*" not in name:
            continue  # what _SECTION says, without running it for every plain parameter
        match = _SECTION.match(name)
        if match is None or match.group("name") != wanted:
            continue
        if match.group("index") is None:
            # "name*=charset'lang'value": the single star marks the extended form.
            sections.setdefault(0, (raw, True))
        else:
            index = int(match.group("index"))
            sections.setdefault(index, (raw, match.group("extended") is not None))
    if not sections:
        return None
    charset: str | None = None
    chunks: list[bytes] = []
    for position, index in enumerate(sorted(sections)):
        if index != position:
            break  # a gap ends the value (RFC 2231 section 3)
        raw, extended = sections[index]
        if extended and index == 0:
            parts = raw.split("'", 2)
            if len(parts) == 3:
                charset, raw = parts[0] or None, parts[2]
        data = to_bytes(raw)
        chunks.append(unquote_to_bytes(data) if extended else data)
    return charset, b"".join(chunks)


def _surrogate_bytes(text: str) -> bytes:
    # Header text from the bytes parser carries 8-bit bytes as surrogates; get them back.
    return text.encode("utf-8", "surrogateescape")
