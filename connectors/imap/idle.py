"""IDLE (RFC 2177) on an imapclient connection, and what the server's untagged responses mean.

Wire sample (one IDLE period that ends with new mail)::

    C: A9 IDLE
    S: + idling
    S: * OK Still here
    S: * 4 EXISTS
    C: DONE
    S: A9 OK Idle completed.

Pitfalls handled here (PITFALLS.md, imapclient 4.1): ``idle_check()`` swallows EOF and returns
``[]`` at once (#565): an early empty answer is checked with a NOOP after ``idle_done()``, and
errors of ``idle_done()`` (``IMAPClientAbortError`` or a plain ``OSError``) mean a dead
connection; a cut network would block ``idle_done()`` forever without the read timeout the
connection sets (#449).

Dovecot 2.3 does not announce in IDLE a change that happened after the session's last sync
and before the IDLE command: measured here, a mail appended between a NOOP and the IDLE that
followed it was not announced for as long as the IDLE lasted (3 s, 15 s), only in DONE's
answer. A worker that entered IDLE after its sync's NOOP and STATUS missed any mail appended
in that window until its next light sync (``uidvalidity_check_seconds``, 10 s by default, up
to the catch-up with a longer setting); under load the window is the length of the client's
wait for the CPU, and a stream of mail hits it often. So IDLE starts as ``NOOP`` + ``IDLE``
in one write (RFC 3501 5.5 allows the pipelining): Dovecot syncs for the NOOP and arms IDLE's
watch without reading the socket in between, and whatever came since the last sync is in the
NOOP's answer, which ends the IDLE at once::

    C: A8 NOOP
    C: A9 IDLE
    S: * 5 EXISTS
    S: A8 OK NOOP completed.
    S: + idling
    C: DONE
    S: A9 OK Idle completed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from imapclient import exceptions as imap_exc
from imapclient.imapclient import IMAPClient, _parse_untagged_response

from connectors.imap.errors import ConnectionLost
from connectors.imap.wire import wire

__all__ = ["IdleOutcome", "NoopThenIdle", "classify_untagged", "idle_until"]

#: An idle_check() that returns nothing before this fraction of its timeout did not time out:
#: imapclient swallowed an EOF or socket error (#565).
EARLY_FRACTION = 0.5


@dataclass(frozen=True)
class IdleOutcome:
    """What the server pushed during one IDLE period. ``activity`` is False on a quiet timeout."""

    new_mail: bool = False
    expunged: bool = False
    flags_changed: bool = False
    other: bool = False

    @property
    def activity(self) -> bool:
        return self.new_mail or self.expunged or self.flags_changed or self.other


class IdleClient(Protocol):
    """What IDLE needs of imapclient's ``IMAPClient``; ``idle()`` may return untagged responses
    it read on the way into IDLE (:class:`NoopThenIdle`)."""

    def idle(self) -> list[Any] | None: ...

    def idle_check(self, timeout: float | None = None) -> list[Any]: ...

    def idle_done(self) -> tuple[Any, list[Any]]: ...


def idle_until(
    client: IdleClient,
    deadline: float,
    should_stop: Callable[[], bool],
    slice_seconds: float,
    noop: Callable[[], IdleOutcome],
) -> IdleOutcome:
    """IDLE (RFC 2177) until the server announces a change, ``deadline`` (monotonic time)
    passes, or ``should_stop()``; then DONE. Returns what the server announced.

    Raises ConnectionLost when the connection turns out dead: EOF, BYE, or a DONE that gets
    no answer within the read timeout (a silent connection).
    """
    with wire("idle"):
        told = client.idle() or []
    responses: list[tuple[Any, ...]] = list(told)
    suspicious = False
    try:
        # A change announced on the way in ends this IDLE at once: the sync reads it.
        while not should_stop() and not classify_untagged(told).activity:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = min(slice_seconds, remaining)
            started = time.monotonic()
            with wire("idle_check"):
                got = client.idle_check(timeout=wait)
            if got:
                responses += got
                if classify_untagged(got).activity:
                    break
                continue  # "* OK Still here" keep-alives
            if time.monotonic() - started < wait * EARLY_FRACTION:
                suspicious = True  # imapclient #565: an EOF or socket error was swallowed
                break
    finally:
        # DONE must always be sent; on a dead or silent connection this raises.
        with wire("idle_done"):
            _, tail = client.idle_done()
    responses += tail
    outcome = classify_untagged(responses)
    if suspicious and not outcome.activity:
        noop()  # prove the connection alive, or raise ConnectionLost
    return outcome


def classify_untagged(responses: Sequence[tuple[Any, ...]]) -> IdleOutcome:
    """What untagged responses (of IDLE, or of a NOOP) announce; a BYE is a dead connection.

    >>> classify_untagged([(3, b"EXISTS"), (b"OK", b"Still here")]).new_mail
    True
    """
    new_mail = expunged = flags_changed = other = False
    for response in responses:
        kind = response[1] if len(response) > 1 and isinstance(response[0], int) else None
        head = response[0] if response else None
        if head == b"BYE":
            raise ConnectionLost(f"server said BYE: {response[1:]!r}")
        if kind == b"EXISTS":
            new_mail = True
        elif kind == b"EXPUNGE" or head == b"VANISHED":
            expunged = True  # VANISHED: the expunge with QRESYNC enabled (RFC 7162 3.2.10)
        elif kind == b"FETCH":
            flags_changed = True
        elif head == b"OK" and uidvalidity_code(response):
            other = True  # "* OK [UIDVALIDITY n]": the sync's STATUS compares it
        elif kind == b"RECENT" or head == b"OK":
            continue  # "* OK Still here" keep-alives and RECENT counters
        else:
            other = True  # anything unknown: a full re-sync is the safe answer
    return IdleOutcome(new_mail, expunged, flags_changed, other)


def uidvalidity_code(response: tuple[Any, ...]) -> bool:
    """``* OK [UIDVALIDITY n] ...`` (RFC 3501 7.1): a server may announce a new UIDVALIDITY.

    >>> uidvalidity_code((b"OK", b"[UIDVALIDITY 1700000000] UIDs valid"))
    True
    >>> uidvalidity_code((b"OK", b"Still here"))
    False
    """
    text = response[1] if len(response) > 1 else b""
    return isinstance(text, bytes) and text.upper().startswith(b"[UIDVALIDITY ")


class NoopThenIdle:
    """An ``IMAPClient`` whose ``idle()`` sends NOOP and IDLE in one write and returns the
    NOOP's untagged responses (see the module docstring for why); ``idle_check()`` and
    ``idle_done()`` are imapclient's.

    imapclient 4.1 has no call for two commands in flight, so this goes through the same
    imaplib calls as ``IMAPClient.noop()`` and ``IMAPClient.idle()`` (``_command``,
    ``_get_response``, ``tagged_commands``) and sets ``_idle_tag`` as ``idle()`` does; pyproject
    pins imapclient ``>=4.1,<4.2``: recheck when moving the pin.
    """

    def __init__(self, client: IMAPClient) -> None:
        self.client = client

    def idle(self) -> list[Any]:
        client = self.client
        # Capabilities must be known before IDLE: asking for them later would send CAPABILITY
        # inside IDLE (imapclient's idle_check() checks them; cached after login).
        if not client.has_capability("IDLE"):
            raise imap_exc.IMAPClientError("the server does not offer IDLE")
        imap = client._imap
        noop_tag = imap._command("NOOP")
        idle_tag = imap._command("IDLE")
        told: list[Any] = []
        noop_done = False
        while True:
            line = imap._get_response()  # filed like any answer; None: a continuation
            if line is None:
                break  # "+ idling"
            if imap.tagged_commands.get(idle_tag) is not None:
                raise imap_exc.IMAPClientAbortError(f"IDLE refused: {line!r}")
            if not noop_done and imap.tagged_commands.get(noop_tag) is not None:
                noop_done = True
                continue
            told.append(_parse_untagged_response(line))
        if not noop_done:
            # A server that accepts IDLE before it answers the NOOP: the session's state is
            # not what we think; a new one is (ConnectionLost through wire()).
            raise imap_exc.IMAPClientAbortError("IDLE accepted before the NOOP's answer")
        status, data = imap.tagged_commands.pop(noop_tag)
        if status != "OK":
            raise imap_exc.IMAPClientAbortError(f"NOOP before IDLE: {status} {data!r}")
        client._idle_tag = idle_tag
        return told

    def idle_check(self, timeout: float | None = None) -> list[Any]:
        return list(self.client.idle_check(timeout=timeout))

    def idle_done(self) -> tuple[Any, list[Any]]:
        done: tuple[Any, list[Any]] = self.client.idle_done()
        return done
