"""Flag changes on a server without CONDSTORE: the flags last seen per UID, compared with a
listing (``UID FETCH first:last (FLAGS)``, in UID windows) at every catch-up.

Without MODSEQs (RFC 7162) nothing says which mails changed, so each catch-up lists the flags of
every published mail and publishes UPDATED for those whose flags differ from what this worker
saw last: when it published the mail, or at the previous listing.

Cost per 10,000 mails (``mailtap bench flag-listing``: Dovecot on loopback, half of them
\\Seen, the shared 2-core machine while another benchmark ran): 0.44 MB of FETCH answers
(44 bytes a mail) per listing; 0.21 s (min of 5; median 0.53 s) for the listing and the
comparison, most of it imapclient parsing the answer; the snapshot holds 0.3 MB (a dict entry
per UID, one interned flag set per distinct combination).

Not durable: after a restart the first listing is the baseline, so a flag change made while the
source was down (or between its start and that first listing) is not published; the next
change of that mail is. With CONDSTORE, nothing is missed (the MODSEQ is in the cursor).

``\\Recent`` is left out: it is per session (RFC 3501 2.3.2), not a change of the mail.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

#: UIDs one listing command covers: bounds the answer held at once (~0.3 MB) on a huge folder.
UID_WINDOW = 5000
_SESSION_FLAGS = frozenset({"\\Recent"})


def uid_windows(first_uid: int, last_uid: int, size: int = UID_WINDOW) -> Iterator[tuple[int, int]]:
    """``first..last`` in windows of at most ``size`` UIDs.

    >>> list(uid_windows(1, 12, 5))
    [(1, 5), (6, 10), (11, 12)]
    >>> list(uid_windows(3, 2))
    []
    """
    low = first_uid
    while low <= last_uid:
        high = min(low + size - 1, last_uid)
        yield low, high
        low = high + 1


class FlagSnapshot:
    """The flags this worker last saw for each UID of its folder (one UIDVALIDITY)."""

    def __init__(self) -> None:
        self._uidvalidity: int | None = None
        self._flags: dict[int, frozenset[str]] = {}
        #: One instance per distinct flag set: a mailbox has a handful of them.
        self._interned: dict[frozenset[str], frozenset[str]] = {}

    def _reset_if(self, uidvalidity: int) -> None:
        if uidvalidity != self._uidvalidity:
            self._uidvalidity = uidvalidity
            self._flags.clear()

    def _intern(self, flags: Iterable[str]) -> frozenset[str]:
        value = frozenset(flags) - _SESSION_FLAGS
        return self._interned.setdefault(value, value)

    def remember(self, uidvalidity: int, flags_by_uid: Iterable[tuple[int, Iterable[str]]]) -> None:
        """Mails published with these flags (they are the baseline of the next listing)."""
        self._reset_if(uidvalidity)
        for uid, flags in flags_by_uid:
            self._flags[uid] = self._intern(flags)

    def changed(self, uidvalidity: int, listed: Iterable[tuple[int, Iterable[str]]]) -> list[int]:
        """UIDs whose listed flags differ from the ones last seen, ascending; UIDs seen for the
        first time only become the baseline. A changed UID keeps its old flags until the
        caller publishes it and calls :meth:`remember` (a failed commit finds it again).
        Expunged UIDs (not listed) go at the end of a whole listing (:meth:`retain`).

        >>> snap = FlagSnapshot()
        >>> snap.remember(7, [(1, ["\\\\Seen"]), (2, [])])
        >>> snap.changed(7, [(1, ["\\\\Seen", "\\\\Recent"]), (2, ["\\\\Flagged"]), (3, [])])
        [2]
        >>> snap.changed(7, [(2, ["\\\\Flagged"]), (3, ["\\\\Seen"])])  # 2 not remembered yet
        [2, 3]
        >>> snap.changed(8, [(1, ["\\\\Seen"])])  # another UIDVALIDITY: a new baseline
        []
        """
        self._reset_if(uidvalidity)
        found = []
        for uid, flags in listed:
            now = self._intern(flags)
            before = self._flags.get(uid)
            if before is None:
                self._flags[uid] = now
            elif before != now:
                found.append(uid)
        return sorted(found)

    def forget(self, uids: Iterable[int]) -> None:
        for uid in uids:
            self._flags.pop(uid, None)

    def retain(self, uids: set[int]) -> None:
        """Keep only ``uids`` (those a whole listing found): the others were expunged."""
        for uid in [u for u in self._flags if u not in uids]:
            del self._flags[uid]

    def __len__(self) -> int:
        return len(self._flags)
