"""Delta query on messages of one folder: rounds, pages and state tokens.

Follows https://learn.microsoft.com/en-us/graph/delta-query-messages and
https://learn.microsoft.com/en-us/graph/api/message-delta:

- a round is one or more GETs; every page but the last carries ``@odata.nextLink``
  (``$skiptoken``), the last one ``@odata.deltaLink`` (``$deltatoken``); the tokens are opaque
  and encode the query options (``$select``), so the client follows the links as they are;
- the first round returns every message of the folder; a round from a ``$deltatoken`` returns
  what changed since: a message now in the folder whole, one that left it as
  ``{"@removed": {"reason": "deleted"}}``;
- ``Prefer: odata.maxpagesize=N`` caps a page;
- replays: "the same change appears in subsequent responses" (delta-query-overview,
  "Replays") — ``replay_next_round`` makes the next round from each token repeat the last one;
- expiry: the service answers a dead token with an error code such as ``syncStateNotFound``,
  and a tenant reset with ``410 Gone`` and a ``Location`` header holding the initial query
  (delta-query-overview, "Synchronization reset" and "Token duration").

Tokens stay valid after use (a client that retries a page after a timeout gets it again);
``expire`` kills them.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .mailbox import GraphStore, Mailbox, MailFolder

#: Page size when the client sends no ``odata.maxpagesize`` (Exchange answers 10 a page).
DEFAULT_PAGE_SIZE = 10
#: Larger preferences are clamped; Outlook's largest page is 1000 (``$top`` limit).
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True)
class SyncState:
    """What a ``$skiptoken`` or ``$deltatoken`` stands for."""

    address: str
    folder_id: str
    select: tuple[str, ...] | None
    #: The change-log position this round's changes start after (deltatoken), or None.
    watermark: int
    #: skiptoken only: the entries of the round still to return.
    pending: tuple[str, ...] | None
    #: Where the next round starts: the log position when this round began.
    round_end: int
    #: deltatoken only: the entries of the last page of the round that produced it (replays).
    last_round: tuple[str, ...] = ()
    #: The ``changeType`` option of the initial request (created / updated / deleted), if any.
    change_type: str | None = None


@dataclass
class DeltaPage:
    entries: list[str]  # immutable ids, in order; rendered by the server
    next_token: str | None  # a $skiptoken
    delta_token: str | None  # a $deltatoken


class SyncStateGone(Exception):
    """The token is expired or reset: ``code`` is ``syncStateNotFound`` or ``resyncRequired``."""

    def __init__(self, code: str, state: SyncState) -> None:
        super().__init__(code)
        self.code = code
        self.state = state


class DeltaTracker:
    """All sync states of the server. Called under the store's lock."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store
        self._states: dict[str, SyncState] = {}
        self._expired: dict[str, str] = {}  # token -> error code
        self._replay: set[tuple[str, str]] = set()  # (address, folder id)

    def page(
        self,
        mailbox: Mailbox,
        folder: MailFolder,
        *,
        token: str | None,
        select: tuple[str, ...] | None,
        page_size: int,
        change_type: str | None = None,
    ) -> DeltaPage:
        """One page of a round; ``token`` is a skip or delta token, or None (a new round).

        Raises ``KeyError`` for a token this server never issued, ``SyncStateGone`` for one
        expired by ``expire``."""
        address = mailbox.address.lower()
        if token is None:
            entries = tuple(m.immutable_id for m in self.store.messages_in(mailbox, folder))
            round_end, state_select, state_change = self.store.last_sequence, select, change_type
        else:
            state = self._states[token]
            if token in self._expired:
                raise SyncStateGone(self._expired[token], state)
            if (state.address, state.folder_id) != (address, folder.folder_id):
                raise KeyError(token)
            state_select, state_change = state.select, state.change_type
            if state.pending is not None:
                entries, round_end = state.pending, state.round_end
            else:
                round_end = self.store.last_sequence
                entries = tuple(self.store.changes_since(folder, state.watermark))
                if state_change is not None:
                    entries = tuple(
                        e
                        for e in entries
                        if self._kind(mailbox, folder, e, state.watermark) == state_change
                    )
                if (address, folder.folder_id) in self._replay:
                    self._replay.discard((address, folder.folder_id))
                    fresh = tuple(e for e in entries if e not in state.last_round)
                    entries = state.last_round + fresh
        size = max(1, min(page_size, MAX_PAGE_SIZE))
        head, rest = list(entries[:size]), entries[size:]
        if rest:
            skip = SyncState(
                address,
                folder.folder_id,
                state_select,
                0,
                rest,
                round_end,
                change_type=state_change,
            )
            return DeltaPage(head, self._issue(skip), None)
        # A replay repeats the round's last page: enough for a client to see a duplicate.
        delta = SyncState(
            address,
            folder.folder_id,
            state_select,
            round_end,
            None,
            round_end,
            tuple(head),
            change_type=state_change,
        )
        return DeltaPage(head, None, self._issue(delta))

    def replay_next_round(self, address: str, folder_id: str) -> None:
        """The next round from a delta token of this folder returns its changes plus those of
        the round before (a replay; the same message comes back twice)."""
        self._replay.add((address.lower(), folder_id))

    def expire(self, *, address: str | None = None, folder_id: str | None = None, code: str) -> int:
        """Every token issued so far (of a mailbox, of a folder) answers ``code`` from now on."""
        count = 0
        for token, state in self._states.items():
            if address is not None and state.address != address.lower():
                continue
            if folder_id is not None and state.folder_id != folder_id:
                continue
            self._expired[token] = code
            count += 1
        return count

    @staticmethod
    def _kind(mailbox: Mailbox, folder: MailFolder, immutable_id: str, watermark: int) -> str:
        """created / updated / deleted, relative to the folder at ``watermark``."""
        message = mailbox.messages.get(immutable_id)
        if message is None or message.folder_id != folder.folder_id:
            return "deleted"
        return "created" if folder.arrivals.get(immutable_id, 0) > watermark else "updated"

    def select_of(self, token: str) -> tuple[str, ...] | None:
        """The ``$select`` a token carries (Graph encodes query options into its links)."""
        return self._states[token].select

    def _issue(self, state: SyncState) -> str:
        # Graph's tokens look like base64 blobs ("GwcBoTmPuoTQWfcsAbkYM"); ours are as opaque.
        token = secrets.token_urlsafe(24)
        self._states[token] = state
        return token
