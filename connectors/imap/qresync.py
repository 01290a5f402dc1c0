"""Quick mailbox resynchronisation (QRESYNC, RFC 7162 section 3.2): pure data and parsing, no I/O.

A reconnect that knows the folder's UIDVALIDITY and a MODSEQ up to which every expunge is
handled asks SELECT for what vanished since then, instead of listing every UID of the folder
(``UID SEARCH ALL``) and comparing it with the account index. Wire sample::

    C: A5 SELECT "INBOX" (QRESYNC (1796173169 11 1:10))
    S: * OK [HIGHESTMODSEQ 14] Highest
    S: * VANISHED (EARLIER) 2:3
    S: * 3 FETCH (UID 5 FLAGS (\\Flagged) MODSEQ (14))
    S: A5 OK [READ-WRITE] Select completed.

The FETCH lines (flag changes since that MODSEQ) are not used: flag changes keep their own
path (``SEARCH MODSEQ`` from the cursor's ``highestmodseq``), so the UPDATED events are the
same with and without QRESYNC.

imapclient 4.1 neither sends SELECT parameters nor parses VANISHED (PITFALLS.md), hence this
module and ``ImapConnection.select``'s own SELECT.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from connectors.imap.uidset import UidSet


@dataclass(frozen=True)
class QresyncRequest:
    """What a SELECT asks with ``(QRESYNC (uidvalidity modseq known-uids))``."""

    uidvalidity: int
    #: Every expunge up to this MODSEQ is handled (``Cursor.vanished_modseq``); > 0.
    modseq: int
    #: Only UIDs up to this one matter (the ones published); 0: no known-uids restriction.
    last_uid: int = 0

    def parameter(self) -> str:
        """The SELECT parameter.

        >>> QresyncRequest(1796173169, 11, 10).parameter()
        '(QRESYNC (1796173169 11 1:10))'
        >>> QresyncRequest(7, 3).parameter()
        '(QRESYNC (7 3))'
        """
        known = f" 1:{self.last_uid}" if self.last_uid > 0 else ""
        return f"(QRESYNC ({self.uidvalidity} {self.modseq}{known}))"


def parse_vanished(lines: Sequence[bytes | str]) -> UidSet:
    """The UIDs of ``* VANISHED [(EARLIER)] uid-set`` lines (RFC 7162 section 3.2.10), as
    imaplib files them (the text after ``VANISHED``).

    A server may report UIDs that never existed or were not in the known set (section
    3.2.5.2): callers intersect with what they published.

    >>> parse_vanished([b"(EARLIER) 2:3", b"(EARLIER) 9,12:13"]).ranges
    ((2, 3), (9, 9), (12, 13))
    >>> len(parse_vanished([]))
    0
    """
    ranges: list[tuple[int, int]] = []
    for line in lines:
        text = line.decode("ascii", "replace") if isinstance(line, bytes) else line
        tokens = text.split()
        if tokens and tokens[0].upper() == "(EARLIER)":
            tokens = tokens[1:]
        if len(tokens) != 1:
            raise ValueError(f"not a VANISHED response: {text[:80]!r}")
        ranges += UidSet.parse(tokens[0]).ranges
    return UidSet(ranges)


#: Up to this many VANISHED UIDs are looked up in the account index one by one; a larger answer
#: (a server may report every UID that does not exist, section 3.2.5.2) is intersected with
#: the folder's UIDs read from the index at once.
DIRECT_LOOKUPS = 10_000


def vanished_candidates(
    vanished: UidSet, last_uid: int, known: Callable[[], Sequence[int]]
) -> Sequence[int]:
    """The UIDs to look up in the index as gone: the vanished ones up to ``last_uid`` (the
    ones published). A small answer is used as it is, so the check costs what vanished, not
    what the folder holds; a large one is narrowed to ``known()`` (the folder's UIDs in the
    index).

    >>> list(vanished_candidates(UidSet.parse("2:3,40"), 10, lambda: []))
    [2, 3]
    >>> list(vanished_candidates(UidSet.parse("1:20000"), 30000, lambda: [5, 25000]))
    [5]
    """
    mine = vanished.between(1, last_uid)
    if len(mine) <= DIRECT_LOOKUPS:
        return mine
    return [uid for uid in known() if uid in mine]


@dataclass(frozen=True)
class ExpungeCheck:
    """One complete look at what left a folder: a listing (``UID SEARCH ALL``) or a QRESYNC
    SELECT, made when the folder was at ``modseq``. Once every mail it found gone is decided
    and durable in Kafka, the cursor's ``vanished_modseq`` may move up to ``modseq``."""

    modseq: int
    #: The account's sync-round ticket taken after the answer (syncrounds.py).
    ticket: int
    #: It found gone mails: their keys may have been dropped because another folder holds
    #: them, which is durable only once every other watched folder synced past ``ticket``.
    found_gone: bool

    def merged(self, later: ExpungeCheck) -> ExpungeCheck:
        """This check not settled yet, and a later one: settled together, at the later one.

        >>> ExpungeCheck(5, 2, True).merged(ExpungeCheck(9, 4, False))
        ExpungeCheck(modseq=9, ticket=4, found_gone=True)
        """
        return ExpungeCheck(
            max(self.modseq, later.modseq), later.ticket, self.found_gone or later.found_gone
        )
