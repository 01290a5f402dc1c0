"""Where each message identity of an account currently lives: the basis of the tombstone rule.

An expunged mail becomes a tombstone only when its key is gone from *every* watched folder of the
account (DESIGN.md); a move is an UPDATED event with the new folder. IMAP has no "moved" signal:
the source folder sees an EXPUNGE, the target an EXISTS, in any order. So each account keeps one
index ``key -> {folder: uid}`` shared by its folder workers, rebuilt at start and kept up to date
as mails are published. It is rebuilt from the index changelog (:mod:`connectors.imap.indexlog`):
each event is written with a record saying its key is in that folder (one record per key and
folder, tombstoned when the mail leaves it), in the same transaction, on a compacted topic
partitioned by account, so a start reads only its own accounts' partitions, not
the whole of ``mail.events`` (issue 12). An account that has published events but has no
complete changelog yet (an upgrade) is rebuilt once from ``mail.events``, the newest event per key
saying where the mail was last seen, and written to the changelog.

The index is the one structure of the source that grows with the mailbox, so it lives in a
private temporary SQLite database (on disk, deleted when closed) behind a small page cache: the
connector's memory stays flat however large the mailbox is (issue #3). It is a cache of the
changelog, so nothing about it needs to be durable.

It also decides the key of a mail whose Message-ID another mail of the account has already
(:func:`~connectors.core.mail.identity.key_candidates`): each key is stored with the content
fingerprint it was published with, so the same mail always finds its own key again (after a
move, a rescan, a restart) and a different mail gets a distinct ``#<fp8>`` key.

Thread-safe: the folder workers of an account run on their own threads.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import KafkaSettings
from connectors.core.errors import DataError
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.offsets import OffsetStore
from connectors.core.kafka.readtoend import read_batches_to_end, topic_partitions
from connectors.core.mail.identity import key_candidates, message_id_of_key
from connectors.imap.cursor import SOURCE
from connectors.imap.indexlog import (
    READ_TO_END,
    VERSION,
    ChangelogPartition,
    Entry,
    IndexChangelog,
    Outdated,
    Row,
    location_key,
)
from connectors.imap.syncrounds import SyncRounds

log = logging.getLogger(__name__)

#: Reading mail.events at start waits for open transactions to settle (read_committed); a
#: zombie's transaction is aborted by the broker within the transaction timeout (60 s).
LOAD_TIMEOUT_S = 120.0

#: SQLite page cache per database, in KiB (negative ``cache_size``): the bound on the memory the
#: index uses. 2 MiB holds the upper B-tree levels of a few hundred thousand keys, so a lookup
#: reads at most a leaf page from the OS page cache.
CACHE_KIB = 2048

#: Rows looked up per query in ``register_many``: well below SQLite's bound-parameter limit
#: (32,766 since 3.32, 999 before), large enough that one query serves a whole worker batch.
CHUNK = 500

#: Keys handed to ``register_many`` at a time while rebuilding from the events topic.
LOAD_BATCH = 1000

# A temporary cache, rebuilt from Kafka at start: no durability (synchronous=OFF). The rollback
# journal stays in memory so a failed batch still rolls back whole.
# 1 KiB pages, set before the first table: SQLite allocates a database's first page-cache slab
# by pages, and with 4 KiB pages that is ~60 KB more per account (measured: 119 -> 58 KB for an
# empty index) in a process holding hundreds of accounts; the cache bound stays CACHE_KIB. The
# price: ~2 us more per key placed (200,000 keys: 1.35 -> 1.8 s), against ms per mail ingested.
_PRAGMAS = (
    "PRAGMA page_size=1024",
    f"PRAGMA cache_size=-{CACHE_KIB}",
    "PRAGMA journal_mode=MEMORY",
    "PRAGMA synchronous=OFF",
    "PRAGMA temp_store=FILE",
)

# ``keys``: one row per known key (published and not tombstoned) with its number of locations,
# the content fingerprint it was published with (NULL: unknown, an event written before
# events carried it) and the folder it was placed in last (NULL: unknown, restored at start);
# ``locations``: ``(folder, uid) -> key`` under the UIDVALIDITY it was seen with. A forgotten key
# may keep rows in ``locations`` (as the worker's expunge handling expects): removing one then
# returns the key with no location left.
_SCHEMA = (
    "CREATE TABLE keys (key TEXT PRIMARY KEY, places INTEGER NOT NULL, fingerprint TEXT,"
    " folder INTEGER) WITHOUT ROWID",
    "CREATE TABLE locations (folder INTEGER NOT NULL, uid INTEGER NOT NULL,"
    " key TEXT NOT NULL, uidvalidity INTEGER, PRIMARY KEY (folder, uid)) WITHOUT ROWID",
)

Location = tuple[str, str, int | None, int | None]
"""``(key, folder, uidvalidity, uid)`` as given to `AccountIndex.register_many`."""

Sighting = tuple[str, str | None, str, int | None, int | None]
"""``(key, fingerprint, folder, uidvalidity, uid)`` as given to `AccountIndex.place_many`."""


def _open_temporary_db() -> sqlite3.Connection:
    # "" is SQLite's private temporary on-disk database, deleted when the connection closes.
    # Autocommit mode (isolation_level=None): transactions are explicit, see `_transaction`.
    db = sqlite3.connect("", isolation_level=None, check_same_thread=False)
    for pragma in _PRAGMAS:
        db.execute(pragma)
    return db


class AccountIndex:
    """Where the published keys of one account are: ``(folder, uid) -> key`` plus a count of
    locations per key, in a temporary SQLite database (a few MB of memory at most).

    Call `close` when done; it deletes the database.
    """

    def __init__(self, account: str) -> None:
        self.account = account
        self._db = _open_temporary_db()
        for statement in _SCHEMA:
            self._db.execute(statement)
        #: Folder names as small integers: a few per account, stored once per location row.
        self._folders: dict[str, int] = {}
        #: Number of rows in ``keys``, kept here because ``count(*)`` scans the table.
        self._known = 0
        #: Bare Message-ID keys some other mail holds a ``#`` key of (a few: mails sharing an
        #: id are rare); only their mails need the suffixed keys looked up.
        self._split: set[str] = set()
        self._lock = threading.Lock()
        #: When each folder of the account last synced: decides when an expunge is a tombstone.
        self.rounds = SyncRounds()
        #: Where the account's records of the index changelog go (set by `load_indexes`; None:
        #: an index built without one, e.g. in unit tests).
        self.changelog: ChangelogPartition | None = None
        #: How `load_indexes` built it.
        self.load: IndexLoad | None = None
        #: folder -> UIDs its worker is asked to publish again (`republish_elsewhere`).
        self._republish: dict[str, set[int]] = {}

    # --- publishing ------------------------------------------------------------------------------

    def register(self, key: str, folder: str, uidvalidity: int | None, uid: int | None) -> bool:
        """Record that ``key`` is in ``folder``; returns True when the account knew the key before
        (published and not tombstoned): a move or copy, not a new mail.

        ``uid=None`` records a location we cannot address by UID (a mail we moved ourselves).
        """
        return self.register_many([(key, folder, uidvalidity, uid)])[0]

    def register_many(self, items: Sequence[Location]) -> list[bool]:
        """`register` each ``(key, folder, uidvalidity, uid)`` in order, in one transaction;
        returns what each `register` call would have returned."""
        sightings = [(key, None, folder, v, uid) for key, folder, v, uid in items]
        return [known for _, known in self.place_many(sightings, resolve=False)]

    def place(
        self,
        key: str,
        fingerprint: str | None,
        folder: str,
        uidvalidity: int | None,
        uid: int | None,
    ) -> tuple[str, bool]:
        """`register` a mail parsed as ``key`` with this content fingerprint under the key the
        account knows it by; returns ``(key, known before)``."""
        return self.place_many([(key, fingerprint, folder, uidvalidity, uid)])[0]

    def place_many(
        self, items: Sequence[Sighting], resolve: bool = True, restored: bool = False
    ) -> list[tuple[str, bool]]:
        """`place` each ``(key, fingerprint, folder, uidvalidity, uid)`` in order, in one
        transaction. With ``resolve=False`` the keys are taken as they are (the events topic
        read back at start) and only their fingerprints recorded. ``restored``: read back at
        start, so which of a key's folders its last event names is not known."""
        placed: list[tuple[str, bool]] = []
        with self._lock:
            with self._transaction():
                for start in range(0, len(items), CHUNK):
                    chunk = items[start : start + CHUNK]
                    placed.extend(self._register_chunk(chunk, resolve, restored))
            self._known += sum(1 for _, known in placed if not known)
            return placed

    def _register_chunk(
        self, items: Sequence[Sighting], resolve: bool, restored: bool
    ) -> list[tuple[str, bool]]:
        # Read the rows the chunk touches, apply the chunk to them in memory with the rules of
        # one `register` call, write back what changed: a few statements per chunk, not per mail.
        wanted: dict[int, list[int]] = {}
        for _, _, folder, _, uid in items:
            if uid is not None:
                wanted.setdefault(self._folder_id(folder), []).append(uid)
        located = self._locations(wanted)
        rows = self._rows({key for key, *_ in items} | {key for key, _ in located.values()})
        if resolve:
            rows.update(self._rows(self._suffixed(items, rows, self._split)))
        changed_rows: set[str] = set()
        changed_locations: set[tuple[int, int]] = set()
        placed: list[tuple[str, bool]] = []
        for key, fingerprint, folder, uidvalidity, uid in items:
            if resolve and fingerprint:
                bare, row = key, rows.get(key)
                if bare in self._split or (row is not None and row[1] not in (fingerprint, None)):
                    key = _choose(key_candidates(key, fingerprint), fingerprint, rows)
                    if key != bare:
                        self._split.add(bare)
            elif (base := _split_base(key)) is not None:
                self._split.add(base)  # a ``#`` key read back from the events topic
            placed.append((key, key in rows))
            row = rows.setdefault(key, [0, fingerprint, None])
            if fingerprint is not None:
                row[1] = fingerprint
            row[2] = None if restored else self._folder_id(folder)
            changed_rows.add(key)
            if uid is None:
                row[0] += 1
                continue
            where = (self._folders[folder], uid)
            old = located.get(where)
            located[where] = (key, uidvalidity)
            changed_locations.add(where)
            if old is not None and old[0] == key:
                continue  # seen again where it was: only the UIDVALIDITY may be new
            if old is not None and old[0] in rows:  # a forgotten key has no places to drop
                rows[old[0]][0] = max(rows[old[0]][0] - 1, 0)
                changed_rows.add(old[0])
            row[0] += 1
        self._db.executemany(
            "INSERT OR REPLACE INTO keys (key, places, fingerprint, folder) VALUES (?, ?, ?, ?)",
            [(key, *rows[key]) for key in changed_rows],
        )
        self._db.executemany(
            "INSERT OR REPLACE INTO locations (folder, uid, key, uidvalidity) VALUES (?, ?, ?, ?)",
            [(f, uid, *located[(f, uid)]) for f, uid in changed_locations],
        )
        return placed

    def _locations(
        self, wanted: dict[int, list[int]]
    ) -> dict[tuple[int, int], tuple[str, int | None]]:
        found: dict[tuple[int, int], tuple[str, int | None]] = {}
        for folder, uids in wanted.items():
            rows = self._db.execute(
                "SELECT uid, key, uidvalidity FROM locations"
                f" WHERE folder = ? AND uid IN ({_marks(len(uids))})",
                (folder, *uids),
            )
            for uid, key, uidvalidity in rows:
                found[(folder, uid)] = (key, uidvalidity)
        return found

    @staticmethod
    def _suffixed(
        items: Sequence[Sighting], rows: dict[str, list[Any]], split: set[str]
    ) -> set[str]:
        """The suffixed candidate keys worth looking up: only for a mail whose bare key has
        ``#`` keys, is stored with another fingerprint, or is shared with another mail of the
        chunk. The usual mail (a new Message-ID, or the same mail again) needs none."""
        names: set[str] = set()
        first: dict[str, str | None] = {}  # the fingerprint each key came with first
        for key, fingerprint, *_ in items:
            if not fingerprint:
                continue
            stored = rows[key][1] if key in rows else first.setdefault(key, fingerprint)
            if key in split or (stored is not None and stored != fingerprint):
                names.update(key_candidates(key, fingerprint)[1:])
        return names

    def _rows(self, keys: set[str]) -> dict[str, list[Any]]:
        """``{key: [places, fingerprint, last folder]}`` of the known ones among ``keys``."""
        if not keys:
            return {}
        rows = self._db.execute(
            f"SELECT key, places, fingerprint, folder FROM keys WHERE key IN ({_marks(len(keys))})",
            tuple(keys),
        )
        return {key: [places, fingerprint, folder] for key, places, fingerprint, folder in rows}

    # --- publishing order across folders --------------------------------------------------------

    def republish_elsewhere(self, committed: Sequence[tuple[str, str, int]]) -> dict[str, set[int]]:
        """After the commit of new mail ``(key, folder, uid)``: ask the workers of the other
        folders that placed one of those keys meanwhile to publish it again; returns what was
        asked, per folder.

        A mail appended and moved at once is new to the first folder's worker and, while that
        worker's transaction is still open, already known to the target's (the index is
        shared): the target publishes UPDATED (its folder), and its transaction may commit
        first. The ADDED committed after it names the folder the mail left on ``mail.events``
        (the index changelog keeps both folders' records, one per key and folder, and the
        first folder's is tombstoned when it sees the expunge); a consumer of the events, or
        an index rebuilt from them, would take the mail for gone from the target (soak seed
        4). Published again after this commit, the target's event is the key's last one.
        Only keys with another location now need it: one lookup by key, and a scan of the
        locations in the rare case that finds one.
        """
        asked: dict[str, set[int]] = {}
        with self._lock:
            names = {number: name for name, number in self._folders.items()}
            for key, folder, _ in committed:
                row = self._db.execute("SELECT places FROM keys WHERE key = ?", (key,)).fetchone()
                if row is None or row[0] < 2:
                    continue  # only where this commit put it: nobody published it before us
                rows = self._db.execute(
                    "SELECT folder, uid FROM locations WHERE key = ? AND folder != ?",
                    (key, self._folders.get(folder)),
                )
                for folder_id, uid in rows:
                    asked.setdefault(names[folder_id], set()).add(uid)
            for folder, uids in asked.items():
                self._republish.setdefault(folder, set()).update(uids)
        if asked:
            self.rounds.ask(asked)
        return asked

    def republish_remaining(self, key: str, left: str) -> dict[str, set[int]]:
        """``key`` left folder ``left`` and is still in another: when its last event may name
        ``left`` (placed there last, or restored at start: not known), ask the worker of one
        folder it is still in to publish it again, an UPDATED saying where it is; returns
        what was asked. A move needs none: the target's event came after (placed last).

        Without it a mail kept in two folders and deleted from the one its last event names
        stays there on ``mail.events`` for good (nothing else publishes it again)."""
        with self._lock:
            left_id = self._folders.get(left)
            row = self._db.execute("SELECT folder FROM keys WHERE key = ?", (key,)).fetchone()
            if left_id is None or row is None or row[0] not in (None, left_id):
                return {}
            other = self._db.execute(
                "SELECT folder, uid FROM locations WHERE key = ? AND folder != ?"
                " ORDER BY folder, uid LIMIT 1",
                (key, left_id),
            ).fetchone()
            if other is None:
                return {}  # elsewhere without a UID (a move without COPYUID): its event says so
            names = {number: name for name, number in self._folders.items()}
            asked = {names[other[0]]: {int(other[1])}}
            self._republish.setdefault(names[other[0]], set()).add(int(other[1]))
            # The event asked for will name that folder: a later departure from ``left``'s
            # copies asks no more.
            self._db.execute("UPDATE keys SET folder = ? WHERE key = ?", (other[0], key))
        self.rounds.ask(asked)
        return asked

    def ask_republish(self, folder: str, uids: Iterable[int]) -> None:
        """Ask ``folder``'s worker to publish these UIDs again (a retry of `take_republish`)."""
        with self._lock:
            self._republish.setdefault(folder, set()).update(uids)
        self.rounds.ask([folder])

    def take_republish(self, folder: str) -> list[int]:
        """The UIDs ``folder``'s worker was asked to publish again, ascending (taken: put them
        back with `ask_republish` when their commit fails)."""
        with self._lock:
            return sorted(self._republish.pop(folder, ()))

    # --- reconciling expunges --------------------------------------------------------------------

    def uids(self, folder: str, uidvalidity: int) -> array[int]:
        """The UIDs known in ``folder`` under this UIDVALIDITY, ascending (8 bytes each)."""
        found: array[int] = array("Q")
        with self._lock:
            folder_id = self._folders.get(folder)
            if folder_id is None:
                return found
            rows = self._db.execute(
                "SELECT uid FROM locations WHERE folder = ? AND uidvalidity = ? ORDER BY uid",
                (folder_id, uidvalidity),
            )
            found.extend(uid for (uid,) in rows)
        return found

    def uids_in(self, folder: str, uidvalidity: int) -> dict[int, str]:
        """``{uid: key}`` known in ``folder`` under this UIDVALIDITY."""
        with self._lock:
            folder_id = self._folders.get(folder)
            if folder_id is None:
                return {}
            rows = self._db.execute(
                "SELECT uid, key FROM locations WHERE folder = ? AND uidvalidity = ?",
                (folder_id, uidvalidity),
            )
            return dict(rows)

    def remove(self, folder: str, uid: int) -> tuple[str, bool] | None:
        """Forget ``(folder, uid)``; returns ``(key, still_elsewhere)`` or None if unknown."""
        with self._lock:
            folder_id = self._folders.get(folder)
            if folder_id is None:
                return None
            with self._transaction():
                row = self._db.execute(
                    "SELECT key FROM locations WHERE folder = ? AND uid = ?", (folder_id, uid)
                ).fetchone()
                if row is None:
                    return None
                key: str = row[0]
                self._db.execute(
                    "DELETE FROM locations WHERE folder = ? AND uid = ?", (folder_id, uid)
                )
                self._db.execute(
                    "UPDATE keys SET places = max(places - 1, 0) WHERE key = ?", (key,)
                )
                left = self._db.execute("SELECT places FROM keys WHERE key = ?", (key,)).fetchone()
            return key, left is not None and left[0] > 0

    def unplace(self, placed: Sequence[tuple[str, str, int]]) -> None:
        """Undo the placements of new mail ``(key, folder, uid)`` whose transaction did not
        commit: their retry must find them new again (ADDED), not published before (UPDATED)."""
        for key, folder, uid in placed:
            # Only this folder's worker places mail in its folder: what is there is still ours
            # unless another key took the UID since.
            with self._lock:
                row = self._db.execute(
                    "SELECT key FROM locations WHERE folder = ? AND uid = ?",
                    (self._folders.get(folder), uid),
                ).fetchone()
            if row is not None and row[0] == key:
                self.remove(folder, uid)
                self.forget_unless_located(key)

    def located(self, key: str) -> bool:
        """True when ``key`` has a location in some folder (a copy, or where it was moved)."""
        with self._lock:
            row = self._db.execute("SELECT places FROM keys WHERE key = ?", (key,)).fetchone()
            return row is not None and row[0] > 0

    def left_folder(self, key: str, folder: str) -> bool:
        """True when ``key`` (a mail removed from ``folder``) has no copy left in ``folder``:
        its changelog record for that folder goes.

        Locations are indexed by (folder, UID), not by key, so finding a key in a folder scans
        the folder's locations. Asked for every mail that leaves a folder (a move), that is a
        scan of a large folder per mail; so the scan is made only when a copy here is likely:
        the key was placed in this folder last, or restored at start and not placed since. A
        key placed in another folder last (a move's target) has left, unless a second copy of
        it was already here before that (two copies of one mail in one folder: KEYS.md)."""
        with self._lock:
            folder_id = self._folders.get(folder)
            row = self._db.execute(
                "SELECT places, folder FROM keys WHERE key = ?", (key,)
            ).fetchone()
            if folder_id is None or row is None or row[0] == 0:
                return True
            if row[1] is not None and row[1] != folder_id:
                return True
            found = self._db.execute(
                "SELECT 1 FROM locations WHERE folder = ? AND key = ? LIMIT 1", (folder_id, key)
            ).fetchone()
            return found is None

    def forget_unless_located(self, key: str) -> bool:
        """`forget` ``key`` unless it has a location (checked and done at once, so a folder
        registering it meanwhile keeps it); True when it has no location (forgotten now or
        before)."""
        with self._lock:
            row = self._db.execute("SELECT places FROM keys WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] > 0:
                return False
            self._known -= self._db.execute("DELETE FROM keys WHERE key = ?", (key,)).rowcount
            return True

    def forget(self, key: str) -> None:
        """The key was tombstoned (it has no location left)."""
        with self._lock:
            self._known -= self._db.execute("DELETE FROM keys WHERE key = ?", (key,)).rowcount

    def forget_folder(self, folder: str) -> None:
        """UIDVALIDITY changed: every UID we knew for ``folder`` is meaningless now."""
        with self._lock:
            folder_id = self._folders.get(folder)
            if folder_id is None:
                return
            with self._transaction():
                self._db.execute(
                    "UPDATE keys SET places = max(places - (SELECT count(*) FROM locations"
                    " WHERE folder = ?1 AND locations.key = keys.key), 0)"
                    " WHERE key IN (SELECT key FROM locations WHERE folder = ?1)",
                    (folder_id,),
                )
                self._db.execute("DELETE FROM locations WHERE folder = ?", (folder_id,))

    @staticmethod
    def message_id(key: str) -> str | None:
        """The normalized Message-ID inside a MESSAGE_ID key (``<account>/mid:<id>[#<fp>]``)."""
        return message_id_of_key(key)

    def __len__(self) -> int:
        with self._lock:
            return self._known

    def close(self) -> None:
        """Delete the database; the index is unusable afterwards. Idempotent."""
        with self._lock:
            self._db.close()

    # --- internals -------------------------------------------------------------------------------

    def _folder_id(self, folder: str) -> int:
        return self._folders.setdefault(folder, len(self._folders))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def _marks(count: int) -> str:
    return ",".join("?" * count)


def _split_base(key: str) -> str | None:
    """The bare key of a ``#`` key (``<account>/mid:<id>#<hex>``), else None."""
    message_id = message_id_of_key(key)
    if message_id is None or "#" not in key[key.index("/mid:") :]:
        return None
    bare = f"{key.partition('/mid:')[0]}/mid:{message_id}"
    return bare if bare != key else None


def _choose(candidates: tuple[str, ...], fingerprint: str, rows: dict[str, list[Any]]) -> str:
    """The key for a mail with this fingerprint among its ``candidates`` (identity.py): the one
    stored with the same fingerprint, else the bare key when its fingerprint is unknown (an
    event from before events carried one: taken as this mail, the rule of that time), else
    the first one no other mail has."""
    for key in candidates:
        row = rows.get(key)
        if row is not None and row[1] == fingerprint:
            return key
    first = rows.get(candidates[0])
    if first is not None and first[1] is None:
        return candidates[0]
    for key in candidates:
        if key not in rows:
            return key
    return candidates[-1]  # every prefix taken by another mail: only the whole digest is left


#: ``1``: rebuild every named account's index from ``mail.events`` (the path before the
#: changelog) and write it to the changelog again: a repair, and the baseline of
#: ``mailtap bench startup``.
ENV_REBUILD = "MAILTAP_IMAP_INDEX_REBUILD"


@dataclass(frozen=True)
class IndexLoad:
    """How an account's index was loaded (logged; read by tests and ``mailtap bench startup``)."""

    #: Changelog records read by the load (the records of the accounts sharing the partitions
    #: included; one read serves every account of the load).
    changelog_records_read: int
    #: Of those, the records of the accounts of the load.
    changelog_records_kept: int
    #: Records of ``mail.events`` read to rebuild this account (0: restored from the changelog).
    events_scanned: int
    #: Rebuilt from ``mail.events`` (no marker on the changelog yet, or ENV_REBUILD).
    rebuilt: bool


def load_indexes(
    kafka: KafkaSettings, serde: AvroSerde, accounts: Iterable[str], timeout: float = LOAD_TIMEOUT_S
) -> dict[str, AccountIndex]:
    """Rebuild the named accounts' indexes, at a cost that follows those accounts only.

    From the changelog (:mod:`connectors.imap.indexlog`): the partitions of these accounts,
    read_committed, to the end. An account without its marker there that has a cursor
    published events before the changelog existed: it is rebuilt once from ``mail.events``
    (read whole, as before) and written to the changelog with its marker; an account with
    neither is new and gets its marker.
    """
    names = list(dict.fromkeys(accounts))
    indexes = {name: AccountIndex(name) for name in names}
    if not names:
        return indexes
    started = time.monotonic()
    changelog = IndexChangelog.open(kafka)
    for index in indexes.values():
        index.changelog = changelog.partition_for(index.account)
    latest = _LatestLocations()
    scanned = 0
    try:
        restored = changelog.restore(names, latest.record_entries, timeout, latest.record_outdated)
        forced = os.environ.get(ENV_REBUILD) == "1"
        unmarked = [n for n in names if forced or n not in restored.marked]
        published = (
            set(unmarked)
            if forced
            else _with_cursor(kafka, unmarked) | latest.with_outdated(unmarked)
        )
        rebuild = [n for n in unmarked if n in published]
        if rebuild:
            latest.drop(rebuild)  # what the changelog has of them is not the whole account
            scanned = _scan_events(kafka, serde, set(rebuild), latest, timeout)
        if unmarked:
            written = changelog.write_snapshots(
                {a: latest.rows(a) for a in unmarked},
                {a: latest.replaced(a) for a in unmarked},
            )
            for account in rebuild:
                log.info(
                    "imap index: %s had no complete key index on %s (format %d): rebuilt "
                    "from %d records of %s, %d locations written",
                    account,
                    changelog.topic,
                    VERSION,
                    scanned,
                    kafka.topics.events,
                    written[account],
                )
        for account, batch in latest.batches(LOAD_BATCH):
            indexes[account].place_many(batch, resolve=False, restored=True)
    finally:
        latest.close()
    for name, index in indexes.items():
        index.load = IndexLoad(
            changelog_records_read=restored.records_read,
            changelog_records_kept=restored.records_kept,
            events_scanned=scanned if name in rebuild else 0,
            rebuilt=name in rebuild,
        )
    log.info(
        "imap index: %d records read from %s (partitions %s; %d of these accounts), "
        "%d of %s for a rebuild, in %.2fs (%s)",
        restored.records_read,
        changelog.topic,
        ",".join(
            str(p) for p in sorted({i.changelog.partition for i in indexes.values() if i.changelog})
        ),
        restored.records_kept,
        scanned,
        kafka.topics.events,
        time.monotonic() - started,
        ", ".join(f"{n}={len(i)} keys" for n, i in indexes.items()),
    )
    return indexes


def _with_cursor(kafka: KafkaSettings, accounts: Sequence[str]) -> set[str]:
    """The ``accounts`` that have an IMAP cursor: they published events."""
    if not accounts:
        return set()
    wanted = set(accounts)
    found: set[str] = set()
    for key in OffsetStore(kafka).read_all():
        try:
            partition = json.loads(key)
        except ValueError:
            continue
        if isinstance(partition, dict) and partition.get("source") == SOURCE:
            account = partition.get("account")
            if account in wanted:
                found.add(account)
    return found


def _scan_events(
    kafka: KafkaSettings,
    serde: AvroSerde,
    accounts: set[str],
    latest: _LatestLocations,
    timeout: float,
) -> int:
    """Read the whole events topic (read_committed, to the end) into ``latest`` for
    ``accounts``; returns the records read."""
    topic = kafka.topics.events
    consumer = Consumer(
        consumer_config(kafka, group_id=kafka.qualify("mailtap-imap-index"), **READ_TO_END)
    )
    records = 0
    try:
        partitions = topic_partitions(consumer, kafka, topic, 10)
        if not partitions:
            return 0
        # To the end as of now: a busy events topic (other sources keep publishing) never
        # shows an end of stream.
        starts = [TopicPartition(topic, p, 0) for p in partitions]
        for batch in read_batches_to_end(consumer, starts, timeout):
            records += len(batch)
            seen = [_location_of(m.key(), m.value(), accounts, serde) for m in batch]
            latest.record([where for where in seen if where is not None])
    finally:
        consumer.close()
    return records


#: ``(key, account, folder, uidvalidity, uid, fingerprint)`` of the newest event of a key.
_Latest = Row


class _LatestLocations:
    """What a start restores, staged in a temporary database like the index itself (a restart
    over a large mailbox must not hold every key in memory either):

    - ``placed``: the changelog's locations, one row per (key, folder) as compaction keeps
      them: a key in two folders has two rows;
    - ``latest``: the newest event per key while ``mail.events`` is read for a rebuild (the
      compacted topic's meaning: one folder per key);
    - ``outdated``: the account's records of the version 1 changelog format and, for an
      account being rebuilt, its locations read from the changelog: tombstoned by the
      rebuild unless it writes them again.
    """

    def __init__(self) -> None:
        self._db = _open_temporary_db()
        # The rowid keeps the order in which keys were first seen; a NULL folder is a tombstone.
        self._db.execute(
            "CREATE TABLE latest (key TEXT NOT NULL UNIQUE, account TEXT NOT NULL,"
            " folder TEXT, uidvalidity INTEGER, uid INTEGER, fingerprint TEXT)"
        )
        self._db.execute(
            "CREATE TABLE placed (key TEXT NOT NULL, account TEXT NOT NULL, folder TEXT NOT NULL,"
            " uidvalidity INTEGER, uid INTEGER, fingerprint TEXT, UNIQUE (key, folder))"
        )
        self._db.execute(
            "CREATE TABLE outdated (record TEXT PRIMARY KEY, account TEXT NOT NULL,"
            " live INTEGER NOT NULL) WITHOUT ROWID"
        )

    def record(self, seen: Sequence[_Latest]) -> None:
        """Upsert ``(key, account, folder, uidvalidity, uid, fingerprint)`` rows of events in
        topic order."""
        if not seen:
            return
        self._db.execute("BEGIN")
        self._db.executemany(
            "INSERT INTO latest (key, account, folder, uidvalidity, uid, fingerprint)"
            " VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET folder = excluded.folder,"
            " uidvalidity = excluded.uidvalidity, uid = excluded.uid,"
            " fingerprint = coalesce(excluded.fingerprint, fingerprint)",
            seen,
        )
        self._db.execute("COMMIT")

    def record_entries(self, entries: Sequence[Entry]) -> None:
        """Apply changelog entries in topic order: a location upserts its (key, folder) row,
        a tombstone deletes it."""
        if not entries:
            return
        self._db.execute("BEGIN")
        # Runs of the same kind, in order: one statement per run, not per record.
        run: list[Entry] = []
        for entry in entries:
            if run and run[-1][6] != entry[6]:
                self._apply(run)
                run = []
            run.append(entry)
        self._apply(run)
        self._db.execute("COMMIT")

    def _apply(self, run: Sequence[Entry]) -> None:
        if run[0][6]:
            self._db.executemany(
                "INSERT INTO placed (key, account, folder, uidvalidity, uid, fingerprint)"
                " VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (key, folder) DO UPDATE SET uidvalidity = excluded.uidvalidity,"
                " uid = excluded.uid, fingerprint = coalesce(excluded.fingerprint, fingerprint)",
                [entry[:6] for entry in run],
            )
        else:
            self._db.executemany(
                "DELETE FROM placed WHERE key = ? AND folder = ?",
                [(entry[0], entry[2]) for entry in run],
            )

    def record_outdated(self, records: Sequence[Outdated]) -> None:
        """Remember the last state of each record of the version 1 format."""
        self._db.executemany(
            "INSERT OR REPLACE INTO outdated (record, account, live) VALUES (?, ?, ?)", records
        )

    def with_outdated(self, accounts: Sequence[str]) -> set[str]:
        """The ``accounts`` that have live records of the version 1 format: they published
        events (even without a cursor now)."""
        if not accounts:
            return set()
        rows = self._db.execute(
            "SELECT DISTINCT account FROM outdated"
            f" WHERE live AND account IN ({_marks(len(accounts))})",
            tuple(accounts),
        )
        return {account for (account,) in rows}

    def batches(self, size: int) -> Iterator[tuple[str, list[Sighting]]]:
        """The live (not tombstoned) locations, per account, ``size`` at a time."""
        pending: dict[str, list[Sighting]] = {}
        rows = self._db.execute(
            "SELECT key, account, folder, uidvalidity, uid, fingerprint FROM placed"
            " UNION ALL SELECT * FROM (SELECT key, account, folder, uidvalidity, uid, fingerprint"
            " FROM latest WHERE folder IS NOT NULL ORDER BY rowid)"
        )
        for key, account, folder, uidvalidity, uid, fingerprint in rows:
            batch = pending.setdefault(account, [])
            batch.append((key, fingerprint, folder, uidvalidity, uid))
            if len(batch) >= size:
                yield account, batch
                pending[account] = []
        for account, batch in pending.items():
            if batch:
                yield account, batch

    def drop(self, accounts: Sequence[str]) -> None:
        """Forget what was recorded of ``accounts`` (to be rebuilt): their changelog locations
        become outdated records (tombstoned unless the rebuild writes them again)."""
        marks = _marks(len(accounts))
        located = self._db.execute(
            f"SELECT key, account, folder FROM placed WHERE account IN ({marks})", tuple(accounts)
        ).fetchall()
        self.record_outdated([(location_key(k, f), a, True) for k, a, f in located])
        self._db.execute(f"DELETE FROM placed WHERE account IN ({marks})", tuple(accounts))
        self._db.execute(f"DELETE FROM latest WHERE account IN ({marks})", tuple(accounts))

    def rows(self, account: str) -> Iterator[_Latest]:
        """The live rows of one account: its changelog locations, then its events' newest
        locations, each in the order their keys were first seen."""
        yield from self._db.execute(
            "SELECT key, account, folder, uidvalidity, uid, fingerprint FROM placed"
            " WHERE account = ?1"
            " UNION ALL SELECT * FROM (SELECT key, account, folder, uidvalidity, uid, fingerprint"
            " FROM latest WHERE account = ?1 AND folder IS NOT NULL ORDER BY rowid)",
            (account,),
        )

    def replaced(self, account: str) -> Iterator[str]:
        """The record keys of the account a rewrite of it tombstones unless written again."""
        rows = self._db.execute(
            "SELECT record FROM outdated WHERE account = ? AND live", (account,)
        )
        yield from (record for (record,) in rows)

    def close(self) -> None:
        self._db.close()


def _location_of(
    key: bytes | None,
    value: bytes | None,
    accounts: set[str],
    serde: AvroSerde,
) -> _Latest | None:
    """``(key, account, folder, uidvalidity, uid, fingerprint)`` of one event of a watched
    account (folder None for a tombstone), or None when the record says nothing about where an
    IMAP mail is."""
    if key is None:
        return None
    text = key.decode("utf-8", "replace")
    account = text.split("/", 1)[0]
    if account not in accounts:
        return None
    if value is None:
        return text, account, None, None, None, None
    try:
        event = serde.decode(value)
    except DataError:
        return None
    source = event.get("source") or {}
    if source.get("kind") != "IMAP":
        return None
    return (
        text,
        account,
        source["folder"],
        source.get("uidvalidity"),
        source.get("uid"),
        event.get("content_fingerprint"),
    )
