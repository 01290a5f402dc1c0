"""Guards: named, pure checks a mail must pass before any workflow runs.

Each guard returns :data:`PASS` or a :class:`Skip` naming itself and the reason; the pipeline
publishes every skip as a ``SKIPPED`` WorkflowEvent on ``mail.workflow`` (attributes ``guard``
and ``reason``), so "why did nobody answer?" has an answer on Kafka. Before them the pipeline
asks :func:`already_ran`: a mail that already ran its workflow was answered, and its status
stands (the pipeline only counts the repeat, as guard ``dedupe``).

Order in the pipeline (:mod:`streams.pipeline`): :func:`already_ran`, :data:`LOOP_GUARDS`
(RFC 3834 loop prevention and our own addresses), then :func:`reply_age` (no answer to
history), sender authentication (:mod:`streams.auth`), then :func:`rate_limit` per
authenticated sender; after the workflow ran, :func:`rate_limit` per recipient of its commands.

RFC 3834 §2 in one sentence: an automatic responder must not answer mail that is itself
automatic (``Auto-Submitted`` other than ``no``), that has a null return path, that came from a
list or as bulk, or that is a delivery report; and it should limit how often it answers a sender.

>>> from streams.mail import MailView, GuardHeaders
>>> import dataclasses, datetime as dt
>>> mail = MailView.from_record({"key": "k", "account": "a", "source": {"folder": "INBOX"},
...     "from": {"address": "ann@example.com"}, "guard_headers": {"auto_submitted": "auto-replied"},
...     "observed_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
>>> auto_submitted(mail)
Skip(guard='auto_submitted', reason='Auto-Submitted: auto-replied')
>>> first_skip(mail, LOOP_GUARDS, own_addresses=frozenset())
Skip(guard='auto_submitted', reason='Auto-Submitted: auto-replied')
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from streams.config import RateLimitSettings
from streams.mail import MailView


@dataclass(frozen=True, slots=True)
class Pass:
    """The mail may go on."""


@dataclass(frozen=True, slots=True)
class Skip:
    """The mail stops here; ``guard`` and ``reason`` are published."""

    guard: str
    reason: str


Verdict = Pass | Skip
PASS: Final = Pass()

#: Precedence values that mark mass mail (RFC 3834 §2; RFC 2076 §3.9 lists them).
BULK_PRECEDENCE: Final = frozenset({"bulk", "list", "junk"})
#: X-Auto-Response-Suppress tokens that ask us not to answer ([MS-OXCMAIL] §2.2.3.2.14).
SUPPRESS_TOKENS: Final = frozenset({"all", "autoreply"})
#: Local parts RFC 3834 §2 names as never to be answered automatically.
SYSTEM_LOCAL_PARTS: Final = frozenset({"mailer-daemon", "postmaster"})


def _token(value: str) -> str:
    """First token of a structured header value, lower-cased: ``"Auto-Replied; x=1"`` -> ``auto-replied``."""
    return value.split(";", 1)[0].split("(", 1)[0].strip().lower()


def parse_complete(mail: MailView, **_: Any) -> Verdict:
    """A mail the parser could not fully read is recorded, never answered."""
    if mail.parse_error:
        return Skip("parse_complete", f"parse error: {mail.parse_error}")
    return PASS


def auto_submitted(mail: MailView, **_: Any) -> Verdict:
    """RFC 3834 §5: anything but ``Auto-Submitted: no`` is automatic mail."""
    value = mail.guard_headers.auto_submitted
    if value is not None and _token(value) not in ("", "no"):
        return Skip("auto_submitted", f"Auto-Submitted: {value.strip()}")
    return PASS


def null_return_path(mail: MailView, **_: Any) -> Verdict:
    """RFC 3834 §2: no reply when the envelope sender is null (``<>``) or MAILER-DAEMON."""
    value = mail.guard_headers.return_path
    if value is None:
        return PASS
    path = value.strip().strip("<>").strip()
    if not path or path.split("@", 1)[0].lower() == "mailer-daemon":
        return Skip("null_return_path", f"Return-Path: {value.strip() or '<>'}")
    return PASS


def system_sender(mail: MailView, **_: Any) -> Verdict:
    """RFC 3834 §2: never answer mailer-daemon, postmaster, ``owner-*`` or ``*-request``."""
    address = mail.reply_address
    if address is None:
        return Skip("system_sender", "no From or Reply-To address to answer")
    local = address.normalized.split("@", 1)[0]
    if local in SYSTEM_LOCAL_PARTS or local.startswith("owner-") or local.endswith("-request"):
        return Skip("system_sender", f"system address {address.address}")
    return PASS


def mailing_list(mail: MailView, **_: Any) -> Verdict:
    """RFC 3834 §2 / RFC 2369, 2919: List-Id or List-Unsubscribe marks list mail."""
    headers = mail.guard_headers
    if headers.list_id is not None:
        return Skip("mailing_list", f"List-Id: {headers.list_id.strip()}")
    if headers.list_unsubscribe is not None:
        return Skip("mailing_list", "List-Unsubscribe present")
    return PASS


def bulk_precedence(mail: MailView, **_: Any) -> Verdict:
    value = mail.guard_headers.precedence
    if value is not None and _token(value) in BULK_PRECEDENCE:
        return Skip("bulk_precedence", f"Precedence: {value.strip()}")
    return PASS


def delivery_report(mail: MailView, **_: Any) -> Verdict:
    """RFC 6522: ``multipart/report`` carries DSNs (RFC 3464), MDNs and abuse reports."""
    value = mail.guard_headers.content_type
    if value is not None and _token(value) == "multipart/report":
        return Skip("delivery_report", f"Content-Type: {_token(value)}")
    return PASS


def auto_response_suppressed(mail: MailView, **_: Any) -> Verdict:
    """Exchange's ``X-Auto-Response-Suppress: All`` / ``AutoReply`` asks for no auto-reply."""
    value = mail.guard_headers.x_auto_response_suppress
    if value is None:
        return PASS
    tokens = {t.strip().lower() for t in value.split(",")}
    if tokens & SUPPRESS_TOKENS:
        return Skip("auto_response_suppressed", f"X-Auto-Response-Suppress: {value.strip()}")
    return PASS


def own_address(mail: MailView, *, own_addresses: frozenset[str], **_: Any) -> Verdict:
    """Mail from one of our own addresses would start a conversation with ourselves."""
    for address in (mail.sender, mail.reply_address):
        if address is not None and address.normalized in own_addresses:
            return Skip("own_address", f"sent by our own address {address.address}")
    return PASS


def reply_age(mail: MailView, *, now: dt.datetime, max_age_seconds: float, **_: Any) -> Verdict:
    """History is never answered: mail that arrived more than ``max_age_seconds`` before ``now``.

    The arrival is the mailbox's own time (``internal_date``), not the sender's ``Date``
    header, which anyone can set; a mail without one arrived at the latest when the source
    read it (``observed_at``). ``now`` is the worker's clock, never earlier than the mail's
    ``observed_at``: a replay of an old ``mail.events`` by a new app id is judged now, when
    it would write, not when the mail was first read.

    >>> import datetime as dt
    >>> from streams.mail import MailView
    >>> old = MailView.from_record({"key": "k", "account": "a", "guard_headers": {},
    ...     "internal_date": dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
    ...     "observed_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
    >>> reply_age(old, now=old.observed_at, max_age_seconds=2 * 86400)
    Skip(guard='max_reply_age', reason='arrived 2020-01-01T00:00:00+00:00, 2192 days ago; mail older than 2 days (streams.max_reply_age) is not answered')
    """
    arrived = mail.internal_date or mail.observed_at
    age = (max(now, mail.observed_at) - arrived).total_seconds()
    if age > max_age_seconds:
        return Skip(
            "max_reply_age",
            f"arrived {arrived.isoformat()}, {_span(age)} ago; mail older than "
            f"{_span(max_age_seconds)} (streams.max_reply_age) is not answered",
        )
    return PASS


def _span(seconds: float) -> str:
    """``259200`` -> ``3 days``; below two days in hours, below two hours in minutes."""
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f} {unit}"
    return f"{seconds:.0f} seconds"


Guard = Callable[..., Verdict]

#: RFC 3834 loop prevention, cheapest and most specific first.
LOOP_GUARDS: Final[tuple[Guard, ...]] = (
    parse_complete,
    auto_submitted,
    null_return_path,
    delivery_report,
    mailing_list,
    bulk_precedence,
    auto_response_suppressed,
    system_sender,
    own_address,
)


def first_skip(mail: MailView, guards: Sequence[Guard], **context: Any) -> Verdict:
    """Run ``guards`` in order; the first skip wins."""
    for guard in guards:
        verdict = guard(mail, **context)
        if isinstance(verdict, Skip):
            return verdict
    return PASS


def dedupe_key(event_key: str, workflow: str) -> str:
    """Key of the dedupe table: one entry per (mail, workflow) that has run."""
    return f"{workflow}\x1f{event_key}"


def already_ran(mail: MailView, workflow: str, runs: Mapping[str, Any]) -> bool:
    """A mail key runs a workflow at most once: flag changes, rescans and replays stop here.
    Not a guard that publishes a Skip: the mail was answered, and its status stands
    (:mod:`streams.pipeline`)."""
    return runs.get(dedupe_key(mail.key, workflow)) is not None


def _window(value: Any) -> tuple[float, list[float]]:
    """A rates-table value as (clock, reply times); anything else (absent, an older format) is empty."""
    if isinstance(value, Mapping):
        times = [float(t) for t in value.get("times") or ()]
        times.sort()  # written in order (record_reply): a pass over them
        return float(value.get("clock") or 0.0), times
    return 0.0, []


def rate_clock(value: Any, at: float) -> float:
    """The limiter's clock for a key: the latest mail time seen for it, never going back.

    Mails reach the stream out of time order (they are spread over partitions, and a backlog is
    read partition by partition), so a mail's own ``observed_at`` is not "now": an older mail
    must not make newer replies fall out of the window.
    """
    return max(_window(value)[0], at)


def rate_limit(value: Any, at: float, limit: RateLimitSettings, *, who: str) -> Verdict:
    """RFC 3834 §2: at most ``max_replies`` answers per ``window_seconds`` for one key.

    ``value`` is the rates-table entry of the key (``sender/<address>`` or
    ``recipient/<address>``, see :func:`rate_key`), ``at`` the mail's ``observed_at`` (epoch
    seconds, so that a replay sees the same clock). Replies are counted within
    ``(clock - window, clock]`` where the clock is the latest time seen for the key
    (:func:`rate_clock`), so the limit holds whatever order the mails arrive in.

    >>> limit = RateLimitSettings(max_replies=2, window_seconds=60)
    >>> entry = {"clock": 100.0, "times": [90.0, 100.0]}
    >>> rate_limit(entry, 10.0, limit, who="ann@example.com")  # an older mail, read late
    Skip(guard='rate_limit', reason='2 replies for ann@example.com in the last 60s')
    """
    clock, times = _window(value)
    now = max(clock, at)
    recent = len(times) - bisect_right(times, now - limit.window_seconds)
    if recent >= limit.max_replies:
        return Skip(
            "rate_limit", f"{recent} replies for {who} in the last {limit.window_seconds:g}s"
        )
    return PASS


def record_reply(value: Any, at: float, limit: RateLimitSettings) -> dict[str, Any]:
    """The key's new rates-table entry after a reply to a mail observed at ``at``.

    The reply is recorded at the key's clock (``max(clock, at)``), not at ``at``: recorded at an
    old ``at`` it would fall outside the window at once and not count. Only the newest
    ``max_replies`` times are kept; no more are needed to refuse the next one.
    """
    clock, times = _window(value)
    now = max(clock, at)
    kept = times[bisect_right(times, now - limit.window_seconds) :]
    return {"clock": now, "times": [*kept, now][-limit.max_replies :]}


def rate_key(kind: str, address: str) -> str:
    """Key of the rates table: ``sender/ann@example.com`` or ``recipient/ann@example.com``."""
    return f"{kind}/{address.strip().lower()}"
