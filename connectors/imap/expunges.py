"""Mail that left a folder: a tombstone once it is gone from every watched folder of the account.

DESIGN.md: an expunge becomes a tombstone only when the mail is gone from every watched folder of
that account, known only after every other watched folder has been synced past the expunge. A
worker's :class:`ExpungeTracker` finds what left (the SELECT's QRESYNC ``VANISHED``, or a
listing of every UID), keeps those keys waiting with the sync round they were seen gone in
(:mod:`connectors.imap.syncrounds`), and tombstones them once the account's other folders have
synced past that round without placing the key; it also moves the cursor's ``vanished_modseq``
once every check up to a MODSEQ is decided and committed. Everything it writes goes through the
worker's commit (:class:`~connectors.imap.cursor.Commit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from connectors.core.kafka.transactions import SourceRecord
from connectors.core.metrics import SourceMetrics
from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection
from connectors.imap.cursor import Commit, Cursor
from connectors.imap.index import AccountIndex
from connectors.imap.qresync import ExpungeCheck, vanished_candidates
from connectors.imap.records import ChangeKind, Placement, RecordBuilder
from connectors.imap.uidset import UidSet

__all__ = ["ExpungeTracker"]

log = logging.getLogger(__name__)


class ExpungeTracker:
    """The expunges of one folder of one account, from seen gone to tombstoned."""

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        watched_folders: Sequence[str],
        index: AccountIndex,
        builder: RecordBuilder,
        metrics: SourceMetrics,
        labels: tuple[str, str, str],
        cursor: Callable[[], Cursor | None],
        commit: Commit,
        reselect: Callable[[ImapConnection], None],
    ) -> None:
        self.account = account
        self.folder = folder
        self.index = index
        self.builder = builder
        self.metrics = metrics
        self._labels = labels
        self._cursor = cursor
        self._commit = commit
        #: SELECTs the folder again, raising UidValidityChanged when it is not the same epoch.
        self._reselect = reselect
        #: The account's other folders with a worker: an expunge here is a tombstone only
        #: once each of them has synced past it (syncrounds.py).
        self.watched_others = [f for f in watched_folders if f != folder]
        #: The move target when no worker watches it: searched by Message-ID instead.
        self._unwatched_target = (
            account.move_target if account.move_target not in watched_folders else None
        )
        #: Keys of mails gone from this folder and from the index's other places, with the
        #: ticket of the moment they were seen gone: tombstones once the others synced past it.
        self._expunged: dict[str, int] = {}
        #: Keys whose mail left this folder while the key stays known (a copy or the move's
        #: target elsewhere): their key index record for this folder is tombstoned with the
        #: next commit (KEYS.md: one record per key and folder).
        self._departed: set[str] = set()
        #: What the session's QRESYNC SELECT said vanished (with the HIGHESTMODSEQ it spoke
        #: at): the first sync's expunge check, instead of listing the folder.
        self.vanished: tuple[UidSet, int] | None = None
        #: The expunge checks not settled yet: ``vanished_modseq`` moves once they are.
        self._unsettled_check: ExpungeCheck | None = None

    def new_epoch(self) -> None:
        """UIDVALIDITY changed: an expunge check of the old epoch speaks of MODSEQs the new one
        does not share."""
        self._unsettled_check = None

    def _current(self) -> Cursor:
        cursor = self._cursor()
        assert cursor is not None
        return cursor

    def pass_unread(self, conn: ImapConnection, uidnext: int) -> None:
        """UIDs up to ``uidnext - 1`` were given out, and no mail above the cursor is left:
        they were expunged before this source read them (a mail deleted or moved away at once,
        or while the source was down). Move the cursor past them. Otherwise the folder never
        looks settled (UIDNEXT stays above the cursor), and the worker syncs again at once,
        for ever, and never IDLEs: a busy loop of NOOP, STATUS and SEARCH.

        Every UID below ``uidnext`` existed before the STATUS that reported it answered; a NOOP
        now (a completed command: the server shows this session what other sessions did) and a
        second SEARCH see any of them still there, so none is skipped unread. Never published,
        they have no key: nothing to tombstone.
        """
        cursor = self._current()
        conn.noop()
        if conn.uids_from(cursor.last_uid + 1):
            return  # mail arrived meanwhile: the next sync reads it
        log.info(
            "imap %s/%s: uid %d..%d expunged before they were read; the cursor moves past them",
            self.account.name,
            self.folder,
            cursor.last_uid + 1,
            uidnext - 1,
        )
        self._commit([], cursor.advanced(uidnext - 1))

    def reconcile(self, conn: ImapConnection, hms: int | None) -> None:
        """Mails that left this folder and are in none of the index's other places wait for a
        decision (:meth:`settle`): moved to a watched folder whose worker has not seen them
        yet, or deleted.

        What left is what the session's QRESYNC SELECT reported vanished, or else what a
        listing of every UID (``hms``: the HIGHESTMODSEQ before it) lacks."""
        cursor = self._current()
        vanished, self.vanished = self.vanished, None
        last_uid, uidvalidity = cursor.last_uid, cursor.uidvalidity
        if vanished is not None:
            gone_here, hms = vanished
            gone = vanished_candidates(
                gone_here, last_uid, lambda: self.index.uids(self.folder, uidvalidity)
            )
            method = "qresync"
        else:
            known = self.index.uids(self.folder, uidvalidity)
            if not known:
                # Nothing published here: nothing can leave, and nothing did up to ``hms``.
                if hms is not None:
                    self._checked(ExpungeCheck(hms, self.index.rounds.now(), found_gone=False))
                return
            present = conn.all_uids()  # ranges: membership by bisection, not a set of ints
            gone = [u for u in known if u not in present and u <= last_uid]
            del known, present
            method = "listing"
        self.metrics.expunge_checks.labels(*self._labels, method).inc()
        # Taken after the SEARCH (or SELECT) answer: a sync of another folder that begins
        # later sees any copy the server made before expunging here.
        seen_at = self.index.rounds.now()
        waiting = len(self._expunged)
        found_gone = False
        for uid in gone:
            removed = self.index.remove(self.folder, uid)  # None: a UID we never published
            found_gone = found_gone or removed is not None
            if removed is not None and not removed[1]:
                self._expunged.setdefault(removed[0], seen_at)
            elif removed is not None:
                self._departed.add(removed[0])
        if hms is not None:
            self._checked(ExpungeCheck(hms, seen_at, found_gone=found_gone))
        if len(self._expunged) > waiting and self.watched_others:
            log.info(
                "imap %s/%s: %d mails gone from this folder; they become tombstones only if "
                "absent from %s once those have synced",
                self.account.name,
                self.folder,
                len(self._expunged) - waiting,
                ", ".join(self.watched_others),
            )
        if self._expunged:
            self.index.rounds.wait_for_others(self.folder, self.watched_others)

    def _checked(self, check: ExpungeCheck) -> None:
        pending = self._unsettled_check
        self._unsettled_check = check if pending is None else pending.merged(check)

    def _vanished_settled(self) -> Cursor | None:
        """The cursor with ``vanished_modseq`` moved up to the last expunge check, when every
        mail that check (and those before it) found gone is decided and durable: tombstoned
        in the same transaction, or its key placed elsewhere by a sync of that folder that
        began after the check (so committed). None while that is not so: QRESYNC then asks
        again from the older MODSEQ, which only repeats what is known."""
        cursor = self._current()
        check = self._unsettled_check
        if check is None or self._expunged:
            return None
        if check.found_gone and not self.index.rounds.past(check.ticket, self.watched_others):
            return None
        return replace(cursor, vanished_modseq=max(cursor.vanished_modseq, check.modseq))

    def settle(self, conn: ImapConnection) -> None:
        """Tombstone the expunged keys that are in no watched folder of the account, as known
        after every other watched folder has synced past the expunge (DESIGN.md), whatever
        the key kind. A key another folder published meanwhile was moved or copied there:
        its worker published the UPDATED event, and nothing is written here."""
        rounds = self.index.rounds
        decided: list[str] = []
        if not self._expunged:
            self._commit_vanished_settled([])
            return
        for key, seen_at in list(self._expunged.items()):
            # ``past`` before ``located``: once the others are past, their copies are indexed.
            past = rounds.past(seen_at, self.watched_others)
            if self.index.located(key):
                del self._expunged[key]
                self._departed.add(key)  # in another folder now: this folder's record goes
            elif past:
                decided.append(key)
        seen = {key: self._expunged.pop(key) for key in decided}
        try:
            if decided and self._unwatched_target:
                decided = self._not_in_unwatched_target(conn, decided)
            found = self._found_in_watched_others(conn, decided) if decided else []
            forgotten = [key for key in decided if self.index.forget_unless_located(key)]
            # Found on the server in another folder, or placed there meanwhile: not tombstoned,
            # but no longer here.
            self._departed.update(set(decided) - set(forgotten))
            tombstones = found + [r for key in forgotten for r in self.builder.tombstones(key)]
            if not self._expunged:
                rounds.settled(self.folder)
            if tombstones:
                log.info(
                    "imap %s/%s: %d mails expunged from every watched folder: tombstones",
                    self.account.name,
                    self.folder,
                    len(forgotten),
                )
            self._commit_vanished_settled(tombstones)
        except BaseException:
            # Not committed: decide them again next time (the index forgot them, and a
            # listing or VANISHED will not name their UIDs again in this process).
            self._expunged.update(seen)
            raise

    def _commit_vanished_settled(self, tombstones: list[SourceRecord]) -> None:
        """Commit ``tombstones`` and the key index tombstones of this folder's departed keys,
        with ``vanished_modseq`` moved when that is safe now."""
        cursor = self._current()
        settled = self._vanished_settled()
        target = settled or cursor
        departed = list(self._departed)
        records = {(r.topic, r.key): r for r in tombstones}
        left = [key for key in departed if self.index.left_folder(key, self.folder)]
        for key in left:  # (the others: a copy is still here)
            records.update(((r.topic, r.key), r) for r in self.builder.departure(key))
        if records or target != cursor:
            self._commit(list(records.values()), target)
        self._departed.difference_update(departed)  # only once committed: a failure keeps them
        for key in left:
            if self.index.located(key):  # not tombstoned: its event must not name this folder
                self.index.republish_remaining(key, self.folder)
        if settled is not None:
            self._unsettled_check = None  # only once committed: a failed commit keeps it

    def _found_in_watched_others(self, conn: ImapConnection, keys: list[str]) -> list[SourceRecord]:
        """The UPDATED records of those of ``keys`` that another watched folder holds on the
        server although the index has no location there; placed there in the index, so
        they are not tombstoned.

        The index should know every location: the changelog keeps one record per key and
        folder (KEYS.md). But an index rebuilt from ``mail.events`` (an upgrade from the
        version 1 changelog, ``MAILTAP_IMAP_INDEX_REBUILD``) knows one folder per key, the
        newest event's. The server is the truth a tombstone must not contradict, so a
        Message-ID key is looked for there first (one EXAMINE and SEARCH per other folder
        and per batch of decisions, then a re-select); a fingerprint key cannot be searched.
        """
        wanted = {key: m for key in keys if (m := self.index.message_id(key)) is not None}
        if not wanted or not self.watched_others:
            return []
        records: dict[tuple[str, bytes], SourceRecord] = {}
        cursor = self._current()
        try:
            for other in self.watched_others:
                uidvalidity, where = conn.locate_message_ids(other, sorted(set(wanted.values())))
                uids = sorted({uid for found in where.values() for uid in found})
                for mail in conn.fetch(uids) if uids else []:
                    built = self.builder.build(
                        mail,
                        cursor.uidvalidity,
                        self._placed_at(other, uidvalidity, mail.uid),
                        folder=other,
                        location=(uidvalidity, mail.uid),
                    )
                    if built.key is None:
                        continue
                    for record in built.records:
                        if record.topic != self.builder.dlq_topic:
                            records[(record.topic, record.key)] = record
                    log.warning(
                        "imap %s/%s: %s left this folder and is in %s (uid %d), where the key "
                        "index did not place it: published there, not tombstoned",
                        self.account.name,
                        self.folder,
                        built.key,
                        other,
                        mail.uid,
                    )
        finally:
            self._reselect(conn)
        return list(records.values())

    def _placed_at(self, folder: str, uidvalidity: int, uid: int) -> Placement:
        """The placement of a mail found in ``folder`` at ``uid``: an UPDATED of its key."""

        def place(key: str, fingerprint: str | None) -> tuple[str, ChangeKind]:
            return self.index.place(key, fingerprint, folder, uidvalidity, uid)[0], "UPDATED"

        return place

    def _not_in_unwatched_target(self, conn: ImapConnection, keys: list[str]) -> list[str]:
        """``keys`` without those whose Message-ID is in the move target no worker watches
        (moved there by hand; it is not synced, so the server is asked)."""
        assert self._unwatched_target is not None
        wanted = {key: m for key in keys if (m := self.index.message_id(key)) is not None}
        if not wanted:
            return keys
        found = conn.message_ids_in(self._unwatched_target, sorted(set(wanted.values())))
        self._reselect(conn)
        return [key for key in keys if wanted.get(key) not in found]
