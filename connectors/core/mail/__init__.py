"""Pure normalization of raw MIME into ``MailEvent`` records, shared by IMAP and EWS.

Public API::

    parse_mail(raw, *, account, source, flags, internal_date, observed_at,
               limits=None, claim_check=None, change="ADDED") -> ParsedMail
    message_key(account, message_id, raw) -> (key, KeyKind)
    normalize_message_id(raw) -> str | None
    content_fingerprint(raw) -> str
    ParseLimits(...)   # caps, see limits.py

Modules, one concern each: ``headers`` (byte-level head splitting), ``charsets`` (bytes to
text with fallbacks), ``encodedwords`` (RFC 2047), ``params`` (RFC 2045/2231 parameters),
``addresses``, ``identity`` (keys), ``limits`` (caps and pre-scan), ``content`` (bodies and
attachments), ``budget`` (event size), ``parse`` (the assembly). The key convention is in
``KEYS.md``.
"""

from connectors.core.mail.identity import (
    KeyKind,
    content_fingerprint,
    message_key,
    normalize_message_id,
)
from connectors.core.mail.limits import ParseLimits
from connectors.core.mail.parse import ParsedMail, parse_mail

__all__ = [
    "KeyKind",
    "ParseLimits",
    "ParsedMail",
    "content_fingerprint",
    "message_key",
    "normalize_message_id",
    "parse_mail",
]
