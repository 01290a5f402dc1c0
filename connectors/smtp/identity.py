"""Outgoing identities derived from the command id: Message-ID and VERP return path.

Both are deterministic (a resend carries the same Message-ID, DESIGN.md "Delivery semantics") and
reversible, so a bounce is correlated to its command without any lookup table:

- token: the command id itself when it is made of ``[A-Za-z0-9_-]`` (command ids are hex hashes in
  practice), else ``b32.`` + lower-case unpadded base32 of its UTF-8 bytes. A raw token never
  contains a dot, so the two forms cannot collide.
- Message-ID: ``<mailtap.{token}@{domain of the From address}>``, e.g.
  ``<mailtap.3f2a...@example.com>``.
- VERP return path (when ``verp_domain`` is set): ``bounce+{token}@{verp_domain}``. A 64-character
  hash makes a 71-character local part, above RFC 5321's 64; Postfix, Exim and the big providers
  accept it (the limit is not enforced in practice). Use shorter command ids if your relay objects.
"""

from __future__ import annotations

import base64
import re

MESSAGE_ID_PREFIX = "mailtap."
VERP_PREFIX = "bounce+"
_RAW_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,200}")
_B32_PREFIX = "b32."


def command_token(command_id: str) -> str:
    """A dot-atom-safe, reversible form of ``command_id``.

    >>> command_token("3f2a9c")
    '3f2a9c'
    >>> command_token("a/b")
    'b32.mexwe'
    """
    if _RAW_TOKEN.fullmatch(command_id):
        return command_id
    encoded = base64.b32encode(command_id.encode("utf-8")).decode("ascii")
    return _B32_PREFIX + encoded.rstrip("=").lower()


def command_id_from_token(token: str) -> str | None:
    """Inverse of :func:`command_token`; None when ``token`` is not one of ours."""
    if token.startswith(_B32_PREFIX):
        body = token[len(_B32_PREFIX) :].upper()
        try:
            return base64.b32decode(body + "=" * (-len(body) % 8)).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
    return token if _RAW_TOKEN.fullmatch(token) else None


def message_id_for(command_id: str, domain: str) -> str:
    """Message-ID (without angle brackets) of the mail sent for ``command_id``."""
    return f"{MESSAGE_ID_PREFIX}{command_token(command_id)}@{domain.lower()}"


def command_id_from_message_id(message_id: str) -> str | None:
    """The command id a Message-ID (with or without brackets) was derived from, or None."""
    left, _, _domain = message_id.strip().strip("<>").rpartition("@")
    if not left.startswith(MESSAGE_ID_PREFIX):
        return None
    return command_id_from_token(left[len(MESSAGE_ID_PREFIX) :])


def verp_address(command_id: str, verp_domain: str) -> str:
    """Envelope sender that carries the command id back in bounces."""
    return f"{VERP_PREFIX}{command_token(command_id)}@{verp_domain.lower()}"


def command_id_from_verp(address: str, verp_domain: str | None = None) -> str | None:
    """The command id encoded in a VERP address (``bounce+<token>@domain``), or None."""
    local, _, domain = address.strip().strip("<>").rpartition("@")
    if verp_domain is not None and domain.lower() != verp_domain.lower():
        return None
    if not local.lower().startswith(VERP_PREFIX):
        return None
    return command_id_from_token(local[len(VERP_PREFIX) :])
