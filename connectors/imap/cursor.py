"""The resume position of one (account, folder): pure data and pure decisions, no I/O.

Stored in the offsets topic under the source partition ``{"source":"imap","account":..,"folder":..}``
and written in the same Kafka transaction as the events it covers. Wire sample (the value)::

    {"epoch":2,"fresh":[[43,19]],"highestmodseq":17,"last_uid":42,"pending":null,
     "floor_uid":0,"rescan_until":0,"uidvalidity":1700000000,"vanished_modseq":15}

Meaning (the invariant every write keeps):

- every mail with ``uid <= last_uid`` has been published, and its published state reflects every
  change with ``modseq <= highestmodseq``;
- ``fresh`` lists mails published at a MODSEQ above ``highestmodseq`` (they arrived or changed
  while the sync ran); the next CHANGEDSINCE pass skips them unless their MODSEQ moved again, so a
  restart never re-publishes an unchanged mail;
- ``epoch`` counts UIDVALIDITY changes seen (a new epoch = a full rescan);
- ``vanished_modseq``: every mail expunged from the folder at a MODSEQ up to it has its key
  out of the folder in Kafka (a tombstone, or the event of the folder it went to) or was
  decided not to need one; a reconnect asks QRESYNC only for what vanished after it
  (qresync.py). 0: unknown, the next start lists the folder;
- ``pending`` is an after-commit side effect not yet confirmed done: ``{"action": "seen" |
  "move:<folder>", "uids": [...]}`` (state MOVING); ``null`` once it is done (MOVED).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from connectors.core.kafka.transactions import SourceRecord
from connectors.imap.qresync import QresyncRequest

SOURCE = "imap"


@dataclass(frozen=True)
class PendingSideEffect:
    action: str
    uids: tuple[int, ...]
    #: For a move: the target folder's UIDNEXT before the move, so a repair after a crash
    #: between the move and its confirmation finds the moved mails there.
    target_uidnext: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "uids": list(self.uids),
            "target_uidnext": self.target_uidnext,
        }


@dataclass(frozen=True)
class Cursor:
    uidvalidity: int
    last_uid: int
    highestmodseq: int = 0
    epoch: int = 0
    #: (UID, MODSEQ) of mails published at a MODSEQ above ``highestmodseq``: the next change
    #: sync finds them changed and must not publish them again as they are. Bounded by what
    #: changes while a sync runs.
    fresh: tuple[tuple[int, int], ...] = ()
    pending: PendingSideEffect | None = None
    #: After a UIDVALIDITY change, mails below this UID are re-publications (RESCANNED).
    rescan_until: int = 0
    #: Mails up to this UID predate the start position (latest/since) and were never published:
    #: their flag changes are not published either.
    floor_uid: int = 0
    #: An unfinished change sync: (its target HIGHESTMODSEQ, the last UID it got through).
    #: Changes go out in UID order, so after a crash a mail at or below that UID whose MODSEQ
    #: is still at most the target was published already; None between change syncs. (Listing
    #: each published change instead made the cursor grow with a mass flag change, past the
    #: broker's record size at ~60,000 mails.)
    changes_done: tuple[int, int] | None = None
    #: Expunges up to this MODSEQ are handled and durable (see the module docstring); 0: unknown.
    vanished_modseq: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "uidvalidity": self.uidvalidity,
            "last_uid": self.last_uid,
            "highestmodseq": self.highestmodseq,
            "epoch": self.epoch,
            "fresh": [list(pair) for pair in self.fresh],
            "pending": self.pending.to_json() if self.pending else None,
            "rescan_until": self.rescan_until,
            "floor_uid": self.floor_uid,
            "changes_done": list(self.changes_done) if self.changes_done else None,
            "vanished_modseq": self.vanished_modseq,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cursor:
        pending = data.get("pending")
        return cls(
            uidvalidity=int(data["uidvalidity"]),
            last_uid=int(data["last_uid"]),
            highestmodseq=int(data.get("highestmodseq") or 0),
            epoch=int(data.get("epoch") or 0),
            fresh=tuple((int(u), int(m)) for u, m in data.get("fresh") or ()),
            pending=(
                PendingSideEffect(
                    str(pending["action"]),
                    tuple(int(u) for u in pending["uids"]),
                    pending.get("target_uidnext"),
                )
                if pending
                else None
            ),
            rescan_until=int(data.get("rescan_until") or 0),
            floor_uid=int(data.get("floor_uid") or 0),
            changes_done=_pair(data.get("changes_done")),
            vanished_modseq=int(data.get("vanished_modseq") or 0),
        )

    def advanced(self, last_uid: int, fresh: tuple[tuple[int, int], ...] = ()) -> Cursor:
        return replace(self, last_uid=max(self.last_uid, last_uid), fresh=self.fresh + fresh)

    def qresync_request(self) -> QresyncRequest | None:
        """The QRESYNC parameter of a SELECT from this cursor, when it knows up to which MODSEQ
        every expunge is handled (``vanished_modseq``)."""
        if self.vanished_modseq <= 0:
            return None
        return QresyncRequest(self.uidvalidity, self.vanished_modseq, self.last_uid)


def _pair(value: Any) -> tuple[int, int] | None:
    return (int(value[0]), int(value[1])) if value else None


@dataclass(frozen=True)
class StartDecision:
    """What a SELECT means for the stored cursor."""

    cursor: Cursor
    rescan: bool = False
    """True when UIDVALIDITY changed: every mail is re-published (ChangeKind RESCANNED)."""
    new: bool = False
    """True when the folder had no cursor yet."""


def on_select(
    stored: Cursor | None,
    uidvalidity: int,
    uidnext: int,
    highestmodseq: int | None,
    start: str,
    first_uid_since: int | None = None,
) -> StartDecision:
    """Decide the cursor to continue from after SELECT.

    >>> on_select(None, 7, 11, 30, "latest").cursor.last_uid
    10
    >>> on_select(None, 7, 11, 30, "all").cursor.last_uid
    0
    >>> d = on_select(Cursor(6, 99, 5, epoch=1), 7, 11, 30, "latest")
    >>> d.rescan, d.cursor.last_uid, d.cursor.epoch
    (True, 0, 2)

    ``first_uid_since`` is the lowest UID matching ``since:DATE`` (None when nothing matches).
    """
    hms = highestmodseq or 0
    if stored is not None and stored.uidvalidity == uidvalidity:
        return StartDecision(stored)
    if stored is not None:
        # RFC 3501 2.3.1.1: a new UIDVALIDITY invalidates every UID we know. Re-read everything;
        # the identity keys make the re-published events collapse onto the same keys.
        return StartDecision(
            Cursor(uidvalidity, 0, hms, epoch=stored.epoch + 1, rescan_until=uidnext),
            rescan=True,
        )
    if start == "all":
        last = 0
    elif start == "latest":
        last = max(uidnext - 1, 0)
    else:
        last = (first_uid_since - 1) if first_uid_since is not None else max(uidnext - 1, 0)
    return StartDecision(Cursor(uidvalidity, last, hms, floor_uid=last), new=True)


def skip_unchanged(fresh: tuple[tuple[int, int], ...], uid: int, modseq: int | None) -> bool:
    """True when ``uid`` was published at exactly this MODSEQ already (see ``fresh`` above).

    >>> skip_unchanged(((5, 40),), 5, 40), skip_unchanged(((5, 40),), 5, 41)
    (True, False)
    """
    return modseq is not None and (uid, modseq) in fresh


def chunks(uids: Sequence[int], size: int) -> list[list[int]]:
    """>>> chunks([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    """
    return [list(uids[i : i + size]) for i in range(0, len(uids), size)]


def split_by_bytes(uids: list[int], sizes: dict[int, int], budget: int) -> list[list[int]]:
    """Group UIDs so each fetch holds at most ``budget`` bytes (one oversize mail goes alone).

    >>> split_by_bytes([1, 2, 3], {1: 5, 2: 5, 3: 20}, 10)
    [[1, 2], [3]]
    """
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for uid in uids:
        size = sizes.get(uid, 0)
        if current and total + size > budget:
            groups.append(current)
            current, total = [], 0
        current.append(uid)
        total += size
    if current:
        groups.append(current)
    return groups


class Commit(Protocol):
    """The worker's one write, handed to its collaborators (backfill, expunges, side effects):
    ``records`` and the folder's new cursor in one Kafka transaction; ``before_commit`` runs
    after the records are produced and before the commit (a claim-check batch made durable)."""

    def __call__(
        self,
        records: Sequence[SourceRecord],
        cursor: Cursor,
        before_commit: Callable[[], None] | None = None,
    ) -> None: ...
