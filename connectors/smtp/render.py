"""ReplyCommand -> RFC 5322 bytes and SMTP envelope. Pure: no I/O except the blob fetcher passed in.

Wire sample (a reply with text and HTML, no attachment)::

    Message-ID: <mailtap.3f2a...@example.com>
    Date: Sun, 29 Nov 2026 16:00:00 +0000
    From: Support <support@example.com>
    To: =?utf-8?q?J=C3=BCrgen?= <juergen@example.org>
    Subject: Re: Order 42
    In-Reply-To: <orig@example.org>
    References: <older@example.org> <orig@example.org>
    Auto-Submitted: auto-replied
    MIME-Version: 1.0
    Content-Type: multipart/alternative; boundary="==..."

Rules:

- Every header value and address is checked *before* the message is built: any control character
  (CR, LF, NUL, the other C0 controls, DEL, U+0085, U+2028, U+2029 -- the email package and some
  MUAs treat the last three as line breaks) is refused, so no input can add a header
  (CVE-2024-6923 class). Addresses must be plain ``local@domain`` addr-specs with a dot-atom
  local part. An ASCII local part gets its domain IDNA-encoded (A-labels): that goes through
  any relay. A non-ASCII local part (``用户@例子.广告``, RFC 6531) can only be sent with
  SMTPUTF8: such a message is rendered with UTF-8 headers (RFC 6532, no RFC 2047 encoded words)
  and flagged ``smtputf8``; the transport sends it with ``MAIL FROM:<...> SMTPUTF8`` when the
  relay offers the extension, and the outcome is FAILED (5.6.7) when it does not. Otherwise
  non-ASCII display names and subjects are RFC 2047 encoded words.
- ``Date`` is the command's ``created_at`` (RFC 5322 3.6.1: when the creator declared the message
  complete), so a resend renders byte-identical headers.
- Attachments are fetched from the claim-check store and checked against their sha256 and size.
"""

from __future__ import annotations

import hashlib
import re
import sys
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address, HeaderRegistry
from email.message import EmailMessage
from email.policy import EmailPolicy
from email.utils import format_datetime
from typing import TYPE_CHECKING, Any

from connectors.smtp.errors import RenderError
from connectors.smtp.identity import message_id_for, verp_address

BlobFetcher = Callable[[str], bytes]

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL_PART = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*")
# RFC 6531 3.3: atext extended with UTF8-non-ascii (any non-ASCII character; controls and
# line breaks are refused before this by check_header_text, spaces by the class below).
_UTEXT = r"(?:[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]|[^\x00-\x7f\s])+"
_UTF8_LOCAL_PART = re.compile(rf"{_UTEXT}(?:\.{_UTEXT})*")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_MSG_ID = re.compile(r"[\x21-\x3b\x3d\x3f-\x7e]+@[\x21-\x3b\x3d\x3f-\x7e]+")
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_MIME_TYPE = re.compile(rf"{_TOKEN.pattern}/{_TOKEN.pattern}")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[\x21-\x3b\x3d\x3f-\x7e]+")  # no space, < or >
# Unicode category Cc is exactly U+0000-U+001F and U+007F-U+009F (a stable set: the standard
# never adds control characters); tab is allowed. U+2028/U+2029 are line and paragraph breaks.
_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
MAX_ADDRESS_LENGTH = 254  # RFC 5321 4.5.3.1.3 (path) minus the angle brackets
MAX_HEADER_CHARS = 4000


class _CachedHeaderRegistry(HeaderRegistry):
    """The stdlib registry builds a new class with ``type()`` for *every* header it parses
    (``HeaderRegistry.__getitem__``), about 10 us each, a seventh of the render time; the class
    only depends on the header name, so build it once per name.

    It also keeps the headers it made from a string: the content headers the email package
    sets (``Content-Type: text/plain; charset="utf-8"``, ``Content-Transfer-Encoding: 7bit``,
    ``MIME-Version: 1.0``) are the same in nearly every message and parsing them was a quarter
    of a render. A header object is a ``str`` whose parse tree nothing changes after parsing
    (folding reads it; ``set_param``/``set_boundary`` make a new header), so one can serve many
    messages. The cache is bounded: per-message values (a multipart's boundary) just pass.
    """

    _MAX_CACHED = 256

    def __init__(self) -> None:
        super().__init__()
        self._classes: dict[str, type] = {}
        self._headers: dict[tuple[str, str], Any] = {}

    def __getitem__(self, name: str) -> type:
        key = name.lower()
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = super().__getitem__(name)
        return cls

    def __call__(self, name: str, value: Any) -> Any:
        if not isinstance(value, str):
            return super().__call__(name, value)
        header = self._headers.get((name, value))
        if header is None:
            header = super().__call__(name, value)
            if len(self._headers) >= self._MAX_CACHED:
                self._headers.clear()
            self._headers[(name, value)] = header
        return header


#: Printable ASCII words separated by single spaces.
_PLAIN_VALUE = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)*")


if TYPE_CHECKING:
    _EmailPolicy = EmailPolicy[EmailMessage]  # generic in typeshed only
else:
    _EmailPolicy = EmailPolicy


class _RenderPolicy(_EmailPolicy):
    """``policy.SMTP`` that keeps a short plain-ASCII header value as the string it is.

    The default policy parses every header into a registry object when it is set, and folds
    that object's parse tree again when the message is written: two thirds of a render's time.
    For a value of printable ASCII words with single spaces, without ``=?`` (the parser would
    decode an encoded-word look-alike) and whose line fits ``max_line_length``, that fold gives
    the value back unchanged (the parse is lossless and the whole line fits), so a string gives
    the same bytes: the email package writes a string value that fits as is
    (``refold_source="long"``) and refolds a longer one through the registry. An address list
    is kept as the text the registry would parse it from (``", ".join(str(address))``, quoted by
    :class:`Address`). Anything else -- non-ASCII for RFC 2047 or RFC 6532, folding, the
    boundary's Content-Type -- goes through the registry as before. A content header the email
    package reads back (Content-Type) is parsed on each read, from the registry's cache.
    tests/unit/smtp/test_smtp_render_golden.py holds the output to main's bytes and checks it
    against the plain ``policy.SMTP`` for generated values.
    """

    def header_store_parse(self, name: str, value: Any) -> tuple[str, Any]:
        if hasattr(value, "name"):  # already a registry header (graphsubmit copies them)
            return super().header_store_parse(name, value)
        if isinstance(value, Address):
            value = [value]
        text = (
            ", ".join(str(a) for a in value)
            if isinstance(value, list) and all(isinstance(a, Address) for a in value)
            else value
        )
        if (
            isinstance(text, str)
            and len(name) + 2 + len(text) <= (self.max_line_length or sys.maxsize)
            and "=?" not in text
            and _PLAIN_VALUE.fullmatch(text)
        ):
            return (name, text)
        return super().header_store_parse(name, value)


SMTP_POLICY = _RenderPolicy(
    linesep="\r\n", max_line_length=78, header_factory=_CachedHeaderRegistry()
)
#: RFC 6532 headers (raw UTF-8) for a message sent with SMTPUTF8.
SMTPUTF8_POLICY = SMTP_POLICY.clone(utf8=True)


@dataclass(frozen=True)
class RenderedMessage:
    """What the transport needs: envelope plus the exact bytes to put after DATA."""

    command_id: str
    message_id: str
    """Without angle brackets."""
    envelope_from: str
    recipients: tuple[str, ...]
    """to + cc + bcc, deduplicated case-insensitively, in order."""
    data: bytes
    smtputf8: bool = False
    """An address has a non-ASCII local part: the relay must offer SMTPUTF8 (RFC 6531)."""


def check_header_text(value: str, field: str) -> str:
    """Refuse any character that could end a header line or confuse a parser."""
    bad = _FORBIDDEN.search(value)
    if bad:
        raise RenderError(f"{field}: control character {bad.group()!r} not allowed in a header")
    if len(value) > MAX_HEADER_CHARS:
        raise RenderError(f"{field}: longer than {MAX_HEADER_CHARS} characters")
    return value


def needs_smtputf8(address: str) -> bool:
    """True when the local part is not ASCII: only SMTPUTF8 can carry the address as is."""
    return not address.rpartition("@")[0].isascii()


def normalize_address(address: str, field: str, *, utf8: bool = False) -> str:
    """Validate a bare addr-spec; returns it with an IDNA-encoded, lower-cased domain.

    A non-ASCII local part is accepted only with ``utf8`` (the message goes with SMTPUTF8); the
    address then keeps its domain in U-labels (NFC, lower-cased), as RFC 6531 sends it.

    >>> normalize_address("a.b@Bücher.example", "to")
    'a.b@xn--bcher-kva.example'
    >>> normalize_address("用户@例子.广告", "to", utf8=True)
    '用户@例子.广告'
    """
    check_header_text(address, field)
    address = unicodedata.normalize("NFC", address)
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        raise RenderError(f"{field}: {address!r} is not an address of the form local@domain")
    if local.isascii():
        if not _LOCAL_PART.fullmatch(local):
            raise RenderError(f"{field}: {address!r} has an invalid local part (not a dot-atom)")
    elif not utf8:
        raise RenderError(f"{field}: {address!r} has a non-ASCII local part: it needs SMTPUTF8")
    elif not _UTF8_LOCAL_PART.fullmatch(local):
        raise RenderError(f"{field}: {address!r} has an invalid local part (not a dot-atom)")
    ascii_domain = ascii_domain_of(address, field)
    if local.isascii():
        result = f"{local}@{ascii_domain}"
    else:
        result = f"{local}@{ascii_domain.encode('ascii').decode('idna')}"
    if len(result.encode("utf-8")) > MAX_ADDRESS_LENGTH:
        raise RenderError(f"{field}: {address!r} is longer than {MAX_ADDRESS_LENGTH} octets")
    return result


def ascii_domain_of(address: str, field: str) -> str:
    """The domain of ``address`` in A-labels, lower-cased (for Message-IDs and IDNA sending)."""
    domain = address.rpartition("@")[2]
    try:
        ascii_domain = domain.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise RenderError(f"{field}: {address!r} has an invalid domain") from None
    labels = ascii_domain.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise RenderError(f"{field}: {address!r} has an invalid domain")
    return ascii_domain


def _address(value: Mapping[str, Any], field: str, utf8: bool) -> Address:
    addr_spec = normalize_address(str(value.get("address", "")), f"{field}.address", utf8=utf8)
    name = value.get("name")
    display = check_header_text(str(name), f"{field}.name") if name else ""
    local, _, domain = addr_spec.rpartition("@")
    return Address(display_name=display, username=local, domain=domain)


def _addresses(values: Sequence[Mapping[str, Any]], field: str, utf8: bool) -> list[Address]:
    return [_address(v, f"{field}[{i}]", utf8) for i, v in enumerate(values)]


def _message_id_ref(value: str, field: str) -> str:
    bare = check_header_text(value, field).strip().removeprefix("<").removesuffix(">")
    if not _MSG_ID.fullmatch(bare):
        raise RenderError(f"{field}: {value!r} is not a Message-ID")
    return f"<{bare}>"


def _body(msg: EmailMessage, text: str | None, html: str | None) -> None:
    if text is not None and html is not None:
        msg.set_content(text)
        msg.add_alternative(html, subtype="html")
    elif html is not None:
        msg.set_content(html, subtype="html")
    else:
        msg.set_content(text or "")


def _attach(
    msg: EmailMessage, attachments: Sequence[Mapping[str, Any]], fetch: BlobFetcher | None
) -> None:
    for i, ref in enumerate(attachments):
        field = f"attachments[{i}]"
        filename = check_header_text(str(ref["filename"]), f"{field}.filename")
        content_type = str(ref["content_type"]).lower()
        if not _MIME_TYPE.fullmatch(content_type):
            raise RenderError(f"{field}.content_type: {content_type!r} is not type/subtype")
        if fetch is None:
            raise RenderError(f"{field}: no claim-check store configured to fetch {ref['uri']}")
        try:
            data = fetch(str(ref["uri"]))
        except Exception as exc:
            raise RenderError(f"{field}: cannot fetch {ref['uri']}: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != str(ref["sha256"]).lower() or len(data) != int(ref["size"]):
            raise RenderError(f"{field}: content of {ref['uri']} does not match its sha256/size")
        maintype, _, subtype = content_type.partition("/")
        msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)


def _fix_boundaries(msg: EmailMessage, command_id: str, texts: Sequence[str | None]) -> None:
    """Deterministic MIME boundaries, so a resend is byte-identical to the first attempt.

    A boundary must not occur in the content. Ours contain ``=_``, which base64 and
    quoted-printable output never do, so only bodies sent as 7bit/8bit text can hold it: we
    check those and keep the generator's random boundary in that (adversarial) case.
    """
    seed = hashlib.sha256(command_id.encode("utf-8")).hexdigest()[:24]
    for i, part in enumerate(p for p in msg.walk() if p.is_multipart()):
        boundary = f"=_mailtap_{seed}_{i}"
        if not any(text and boundary in text for text in texts):
            part.set_boundary(boundary)


def render(
    command: Mapping[str, Any],
    *,
    fetch_blob: BlobFetcher | None = None,
    verp_domain: str | None = None,
    return_path: str | None = None,
    recipients: Sequence[str] | None = None,
    unsubscribe: Sequence[str] = (),
) -> RenderedMessage:
    """Build the message for a ReplyCommand dict (as decoded by the Avro serde).

    The envelope sender is the VERP address when ``verp_domain`` is set, else ``return_path``
    (the relay account's address), else the From address.
    ``recipients`` restricts the envelope (a retry goes only to the recipients still pending);
    each must be one of the command's own recipients.
    ``unsubscribe``: URIs for ``List-Unsubscribe`` (RFC 2369); when one is an https URL the
    message also carries ``List-Unsubscribe-Post: List-Unsubscribe=One-Click`` (RFC 8058 3.1:
    only with an HTTPS URI).
    Raises :class:`RenderError` for anything unsafe or invalid.
    """
    command_id = check_header_text(str(command["command_id"]), "command_id")
    utf8 = any(
        needs_smtputf8(str(a.get("address", "")))
        for a in (
            command["from"],
            *(command.get("to") or []),
            *(command.get("cc") or []),
            *(command.get("bcc") or []),
            *(command.get("reply_to") or []),
        )
    )
    sender = _address(command["from"], "from", utf8)
    to = _addresses(command.get("to") or [], "to", utf8)
    cc = _addresses(command.get("cc") or [], "cc", utf8)
    bcc = _addresses(command.get("bcc") or [], "bcc", utf8)
    reply_to = _addresses(command.get("reply_to") or [], "reply_to", utf8)
    subject = check_header_text(str(command.get("subject") or ""), "subject")
    all_rcpts: list[str] = []
    seen: set[str] = set()
    for addr in (*to, *cc, *bcc):
        if addr.addr_spec.lower() not in seen:
            seen.add(addr.addr_spec.lower())
            all_rcpts.append(addr.addr_spec)
    if recipients is not None:
        wanted = {normalize_address(r, "recipients", utf8=utf8).lower() for r in recipients}
        if not wanted <= seen:
            raise RenderError(
                f"recipients: {sorted(wanted - seen)} are not recipients of the command"
            )
        all_rcpts = [r for r in all_rcpts if r.lower() in wanted]
    if not all_rcpts:
        raise RenderError("to/cc/bcc: the command has no recipient")

    message_id = message_id_for(command_id, ascii_domain_of(sender.addr_spec, "from"))
    header_policy = SMTPUTF8_POLICY if utf8 else SMTP_POLICY
    msg = EmailMessage(policy=header_policy)
    msg["Message-ID"] = f"<{message_id}>"
    created = command.get("created_at")
    when = created if isinstance(created, datetime) else datetime.now(UTC)
    msg["Date"] = format_datetime(when.astimezone(UTC))
    msg["From"] = sender
    if to:
        msg["To"] = to
    if cc:
        msg["Cc"] = cc
    if reply_to:
        msg["Reply-To"] = reply_to
    msg["Subject"] = subject
    in_reply_to = command.get("in_reply_to")
    parent = _message_id_ref(str(in_reply_to), "in_reply_to") if in_reply_to else None
    if parent:
        msg["In-Reply-To"] = parent
    refs = [
        _message_id_ref(str(r), f"references[{i}]")
        for i, r in enumerate(command.get("references") or [])
    ]
    if parent and parent not in refs:
        refs.append(parent)
    if refs:
        msg["References"] = " ".join(refs)
    auto = command.get("auto_submitted")
    if auto:
        if not _TOKEN.fullmatch(str(auto)):
            raise RenderError(f"auto_submitted: {auto!r} is not a token (RFC 3834)")
        msg["Auto-Submitted"] = str(auto)
    if unsubscribe:
        uris = [check_header_text(u, "unsubscribe") for u in unsubscribe]
        if any(not _URI.fullmatch(u) for u in uris):
            raise RenderError(f"unsubscribe: {uris} are not all plain URIs")
        msg["List-Unsubscribe"] = ", ".join(f"<{u}>" for u in uris)
        if any(u.startswith("https://") for u in uris):
            msg["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    _body(msg, command.get("text_body"), command.get("html_body"))
    _attach(msg, command.get("attachments") or [], fetch_blob)
    if msg.is_multipart():
        _fix_boundaries(msg, command_id, [command.get("text_body"), command.get("html_body")])

    if verp_domain:
        envelope_from = verp_address(command_id, verp_domain)
    elif return_path:
        envelope_from = normalize_address(return_path, "return_path", utf8=utf8)
    else:
        envelope_from = sender.addr_spec
    return RenderedMessage(
        command_id=command_id,
        message_id=message_id,
        envelope_from=envelope_from,
        recipients=tuple(all_rcpts),
        data=msg.as_bytes(policy=header_policy),
        smtputf8=utf8,
    )
