"""What the source does without each IMAP extension, in sentences for the log and /healthz.

The source works on any RFC 3501 server; each extension it finds makes one thing cheaper or
faster, and each one it misses has a fallback (connectors/imap/README.md, "Servers"):

- no IDLE (RFC 2177): polling every ``poll_interval_seconds``, even with ``mode: idle``;
- no CONDSTORE (RFC 7162): flag changes by comparing ``UID FETCH first:last (FLAGS)`` with the
  flags last seen, at every catch-up (:mod:`connectors.imap.flaglisting`);
- no QRESYNC: a reconnect finds expunges by listing the UIDs (``UID SEARCH ALL``), as every
  catch-up does anyway, instead of the SELECT's VANISHED answer;
- no MOVE (RFC 6851): ``after_commit: move:`` as COPY + \\Deleted + (UID) EXPUNGE.

:func:`fallbacks` is pure (capability atoms and settings in, sentences out);
:class:`FallbackReport` says them for one folder, in the log and in ``/healthz``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from connectors.core.metrics import SourceMetrics
from connectors.imap.config import ImapAccountSettings, ImapSourceSettings

__all__ = ["FallbackReport", "fallbacks"]

log = logging.getLogger(__name__)


def fallbacks(
    capabilities: Collection[bytes],
    *,
    mode: str,
    poll_interval: float,
    catchup_interval: float,
    moves: bool,
) -> tuple[str, ...]:
    """The fallbacks a server with ``capabilities`` (after login) makes the source use.

    >>> fallbacks([b"IMAP4REV1", b"UIDPLUS"], mode="idle", poll_interval=30,
    ...           catchup_interval=300, moves=True)  # doctest: +NORMALIZE_WHITESPACE
    ('no IDLE: polling every 30 s instead of mode: idle',
     'no CONDSTORE: flag changes found by listing FLAGS every 300 s',
     'no QRESYNC: a reconnect lists every UID to find expunges',
     'no MOVE: after_commit moves are COPY + EXPUNGE')
    >>> fallbacks([b"IMAP4REV1", b"IDLE", b"CONDSTORE", b"QRESYNC", b"MOVE"], mode="idle",
    ...           poll_interval=30, catchup_interval=300, moves=True)
    ()
    """
    caps = {c.upper() for c in capabilities}
    notes = []
    if mode == "idle" and b"IDLE" not in caps:
        notes.append(f"no IDLE: polling every {poll_interval:g} s instead of mode: idle")
    if b"CONDSTORE" not in caps and b"QRESYNC" not in caps:
        notes.append(
            f"no CONDSTORE: flag changes found by listing FLAGS every {catchup_interval:g} s"
        )
    if b"QRESYNC" not in caps:
        notes.append("no QRESYNC: a reconnect lists every UID to find expunges")
    if moves and b"MOVE" not in caps:
        notes.append("no MOVE: after_commit moves are COPY + EXPUNGE")
    return tuple(notes)


class FallbackReport:
    """The fallbacks of one folder's server, said once per change (a new session on a server
    that was upgraded, or failed over to another one, may have other extensions)."""

    def __init__(
        self,
        *,
        account: ImapAccountSettings,
        folder: str,
        settings: ImapSourceSettings,
        metrics: SourceMetrics,
        labels: tuple[str, str, str],
    ) -> None:
        self.account = account
        self.folder = folder
        self.settings = settings
        self.metrics = metrics
        self.labels = labels
        #: The server's missing extensions and their fallbacks, as last said in the log.
        self.notes: tuple[str, ...] = ()

    def say(self, capabilities: Collection[bytes]) -> None:
        """Log the server's missing extensions and what the source does instead, once (again
        only if they change), and show them in /healthz."""
        notes = fallbacks(
            capabilities,
            mode=self.account.mode,
            poll_interval=self.settings.poll_interval_seconds,
            catchup_interval=self.settings.catchup_poll_seconds,
            moves=self.account.after_commit.startswith("move:"),
        )
        if notes == self.notes:
            return
        self.notes = notes
        self.metrics.set_fallbacks(*self.labels, notes)
        if notes:
            log.warning(
                "imap %s/%s: the server %s: %s",
                self.account.name,
                self.folder,
                self.account.host,
                "; ".join(notes),
            )
