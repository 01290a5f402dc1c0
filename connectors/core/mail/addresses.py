"""Address lists (From, To, Cc, Reply-To) into ``Address`` records.

Parsing uses :func:`email.utils.getaddresses` in its strict mode (CVE-2023-27043: the lax
parser turned ``alice@example.org <bob@example.com>`` into bob). Python builds before the
fix (3.11.7 here) lack ``strict=``; :func:`_strict_getaddresses` then applies the same
validation as the fixed stdlib: balanced parentheses, no ``[`` in an address, and exactly as
many addresses as the field has separators — otherwise the whole field yields nothing.
Display names are RFC 2047-decoded after parsing (decoding first could inject separators).

>>> parse_addresses(["=?utf-8?q?J=C3=BCrgen?= <j@example.com>, bob@example.org"])
[{'name': 'Jürgen', 'address': 'j@example.com'}, {'name': None, 'address': 'bob@example.org'}]
>>> parse_addresses(["alice@example.org <bob@example.com>"])
[]
"""

from __future__ import annotations

import inspect
import re
from email.utils import getaddresses

from connectors.core.mail.charsets import clean_text
from connectors.core.mail.encodedwords import decode_words
from connectors.core.mail.event import Address

__all__ = ["parse_addresses"]

_HAS_STRICT = "strict" in inspect.signature(getaddresses).parameters

# The common shapes, ``Ann Lee <ann.lee@example.com>`` and ``ann@example.com``, read without
# the stdlib's character-by-character parser (a third of the parse time of a plain mail). Only
# plain words in the name and dot-atoms in the address: anything else takes the strict parser,
# and a property test holds both paths to the same answer.
_WORDS = r"[A-Za-z0-9_+-]+(?: [A-Za-z0-9_+-]+)*"
_DOT_ATOM = r"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*"
_ADDR_SPEC = rf"{_DOT_ATOM}@{_DOT_ATOM}"
_SIMPLE = re.compile(rf" *(?:({_WORDS}) *<({_ADDR_SPEC})>|({_ADDR_SPEC})) *")


def parse_addresses(values: list[str]) -> list[Address]:
    """Avro ``Address`` dicts for the given (unfolded, decoded-to-text) field values."""
    if not values:
        return []
    # One loop that gives up at the first value of another shape: two comprehensions and
    # all() (Python 3.11 makes a function call of each comprehension) took the bench mail's
    # From and To 4.2 µs together, the loop 2.9.
    simple: list[Address] = []
    for value in values:
        match = _SIMPLE.fullmatch(value)
        if match is None:
            break
        name, address, bare = match.groups()
        simple.append(
            {"name": name, "address": address} if address else {"name": None, "address": bare}
        )
    else:
        return simple
    pairs = (
        getaddresses(values, strict=True)  # type: ignore[call-arg,unused-ignore]
        if _HAS_STRICT
        else _strict_getaddresses(values)
    )
    out: list[Address] = []
    for name, address in pairs:
        address = clean_text(address.strip())
        if not address:
            continue
        decoded = decode_words(name).strip() if "=?" in name else name.strip()
        out.append({"name": clean_text(decoded) or None, "address": address})
    return out


def _strict_getaddresses(values: list[str]) -> list[tuple[str, str]]:
    """Port of the validation CPython added to ``getaddresses(strict=True)`` (gh-102988)."""
    checked = [value if _balanced_parentheses(value) else "('', '')" for value in values]
    parsed = [
        ("", "") if "[" in address else (name, address)
        for name, address in getaddresses([", ".join(checked)])
    ]
    expected = sum(1 + _strip_quoted(value).count(",") for value in checked)
    if len(parsed) != expected:
        return [("", "")]
    return parsed


def _escaped_chars(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    escape = False
    pos = 0
    for pos, char in enumerate(text):
        if escape:
            out.append((pos, "\\" + char))
            escape = False
        elif char == "\\":
            escape = True
        else:
            out.append((pos, char))
    if escape:
        out.append((pos, "\\"))
    return out


def _strip_quoted(text: str) -> str:
    if '"' not in text:
        return text
    start = 0
    open_pos: int | None = None
    kept: list[str] = []
    for pos, char in _escaped_chars(text):
        if char == '"':
            if open_pos is None:
                open_pos = pos
            else:
                if start != open_pos:
                    kept.append(text[start:open_pos])
                start = pos + 1
                open_pos = None
    if start < len(text):
        kept.append(text[start:])
    return "".join(kept)


def _balanced_parentheses(text: str) -> bool:
    opened = 0
    for _, char in _escaped_chars(_strip_quoted(text)):
        if char == "(":
            opened += 1
        elif char == ")":
            opened -= 1
            if opened < 0:
                return False
    return opened == 0
