"""The source contract: one folder worker per work unit, and the loop every source shares.

After Kafka Connect's ``SourceTask`` and its exactly-once support (KIP-618). A source (IMAP, EWS,
Graph, any later one) implements a :class:`FolderWorker` for one folder of one account; the
run / fence / backoff / commit loop below is written once, here, and a source writes only what
differs: how to connect, how to sync from a cursor, how to wait for a change, and how to map a
mail to events (its record builder, :mod:`connectors.core.source.records`).

Lifecycle, in order (all on the worker's own thread: a source's connection never leaves it)::

    run()                                            the thread body, until ``stop`` is set
      writer = writer_factory(transactional_id)      init_transactions: fences an older instance
                                                     with the same id and aborts its open txn
      _on_new_writer()                               forget the cursor in memory: the next
                                                     read_committed read sees every commit
      _session()                                     the source's: connect, read the cursor,
                                                     sync, wait for change, sync, ... until stop
      FencedError         -> ``fenced``, this unit stops (another instance owns it now)
      any other error     -> _drop_connection(), _after_error(), BACKOFF, wait, a new session
      stop                -> _close(), the writer released, STOPPED

    _commit(records, offset)                          the only write: the records and the
                                                      folder's new cursor in ONE transaction

What each call may block on: ``writer_factory`` on the broker (up to the transactional writer's
init timeout); ``_session`` on the mail server, always with a timeout, and on ``stop`` (a wait
for change must end within about a second of ``stop`` being set, or :meth:`interrupt` must end
it); ``_commit`` on the broker (commit timeout). A source never commits outside ``_commit``.

What holds after a crash (kill -9) at each point:

- before or during ``writer_factory``: nothing of this worker is on Kafka that was not committed;
  the next instance's ``init_transactions`` aborts whatever was open.
- inside ``_session`` before a ``_commit``: the mail read since the last commit is read again
  from the committed cursor; nothing was published.
- inside ``_commit`` (records produced, not committed): the transaction is aborted by the next
  writer of the same transactional id; read_committed consumers never see its records, and the
  cursor on the offsets topic is the previous one, so the batch is published again, once.
- after ``_commit`` returned: the records and the cursor are both committed; the next start
  continues after them. A side effect on the mailbox that follows a commit (IMAP's \\Seen or
  move) is recorded in the cursor as pending before it is done, and repaired at the next start.

A source subclass sets ``connection_lost`` (its exception for "the connection is gone": logged
without a traceback) and implements :meth:`_session`, :meth:`_drop_connection` and
:meth:`_connecting`; the hooks :meth:`_on_new_writer`, :meth:`_after_error`, :meth:`_close` and
:meth:`interrupt` (the runtime's, when it stops the worker) default to nothing, and :meth:`_waiting_state` (the state shown during the wait after an error)
to ``BACKOFF``.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar, Unpack

from connectors.core.kafka.errors import FencedError, PermissionDenied
from connectors.core.kafka.transactions import SourceRecord
from connectors.core.metrics import SourceMetrics
from connectors.core.source.backoff import Backoff
from connectors.core.source.location import SourceLocation
from connectors.core.source.reconnect import backoff_delay
from connectors.core.source.state import StateMachine

__all__ = ["FolderWorker", "Writer"]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=enum.Enum)


class Writer(Protocol):
    """What a worker commits through (:class:`~connectors.core.kafka.transactions.
    TransactionalSourceWriter`): records and cursors in one transaction."""

    def write(
        self,
        records: Sequence[SourceRecord],
        offsets: Mapping[bytes, Mapping[str, Any]]
        | Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
        before_commit: Callable[[], None] | None = None,
    ) -> None: ...

    def close(self) -> None: ...


class FolderWorkerRuntime(TypedDict):
    """What a source's runtime hands each of its folder workers, passed through as keywords."""

    metrics: SourceMetrics
    stop: threading.Event
    #: ``transactional_id`` -> a writer that fenced every older one with that id.
    writer_factory: Callable[[str], Writer]
    #: The offsets topic's committed source offsets (read_committed), by partition key.
    read_offsets: Callable[[], Mapping[bytes, Mapping[str, Any]]]
    transactional_id: str


class FolderWorker(ABC, Generic[E]):
    """Publishes one folder of one account exactly once. ``run()`` is the thread body."""

    #: The source's "connection lost" exception: an expected error, logged without traceback.
    connection_lost: ClassVar[type[Exception]] = ConnectionError

    def __init__(
        self,
        *,
        where: SourceLocation,
        machine: StateMachine[E],
        states: type[E],
        backoff: Backoff,
        **runtime: Unpack[FolderWorkerRuntime],
    ) -> None:
        self.where = where
        self.machine = machine
        self._backoff_state = states["BACKOFF"]
        self._stopped_state = states["STOPPED"]
        self.backoff = backoff
        self.metrics = runtime["metrics"]
        self.stop = runtime["stop"]
        self._writer_factory = runtime["writer_factory"]
        self._read_offsets = runtime["read_offsets"]
        self.transactional_id = runtime["transactional_id"]
        self.partition = where.partition
        self._partition_key = where.partition_key
        self._labels = where.labels
        self._writer: Writer | None = None
        self.fenced = False
        self.last_error: Exception | None = None

    # --- what a source implements -----------------------------------------------------------

    @abstractmethod
    def _session(self) -> None:
        """Connect, position at the committed cursor, then sync and wait for change until
        ``stop``. Raises on any error (the loop backs off and calls it again)."""

    @abstractmethod
    def _drop_connection(self) -> None:
        """Forget the connection without a goodbye (it may be dead)."""

    @abstractmethod
    def _connecting(self) -> bool:
        """Whether the worker is connecting or logging in (an error now is a connect failure)."""

    def interrupt(self) -> None:
        """From another thread, after ``stop`` is set: end a wait for change that does not
        look at ``stop`` at least about once a second (a stream read). Default: nothing."""

    def _on_new_writer(self) -> None:
        """A new writer fenced the older ones: the cursor must be read again from Kafka."""

    def _after_error(self, exc: Exception) -> None:
        """Called after the connection is dropped, before the backoff wait."""

    def _close(self) -> None:
        """The worker ends (stopped or fenced): log out, let threads go."""

    def _waiting_state(self, exc: Exception) -> E:
        """The state shown while the loop waits after ``exc``: ``BACKOFF``, or a source's own
        state that tells an operator more (Graph's ``ACCESS_DENIED`` for a revoked consent)."""
        return self._backoff_state

    def _state_changed(self, _old: E, new: E) -> None:
        """The machine's ``on_change``: the state metric (FENCED is a metric state only: the
        machine ends in STOPPED either way)."""
        self.metrics.set_state(*self._labels, "FENCED" if self.fenced else new.value)

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        self.metrics.watch(*self._labels)
        try:
            while not self.stop.is_set():
                try:
                    if self._writer is None:
                        # init_transactions fences an older instance and aborts its open
                        # transaction, so the cursor read after it sees only committed batches.
                        self._writer = self._writer_factory(self.transactional_id)
                        self.metrics.refused(*self._labels, None)
                        self._on_new_writer()
                    self._session()
                except FencedError as exc:
                    self.fenced = True
                    log.error(
                        "%s: fenced by another instance with the same transactional id (%s); "
                        "stopping this mailbox: %s",
                        self.where,
                        self.transactional_id,
                        exc,
                        extra={"account": self.where.account, "folder": self.where.folder},
                    )
                    return
                except Exception as exc:
                    if self.stop.is_set():
                        break  # interrupted on purpose (stop, interrupt()): nothing to report
                    self._back_off(exc)
        finally:
            self._close()
            self._release_writer()
            self.machine.to(self._stopped_state)

    def _back_off(self, exc: Exception) -> None:
        self.last_error = exc
        if isinstance(exc, PermissionDenied):
            # /healthz says why until the ACL is granted (the mailbox retries at the back-off cap).
            self.metrics.refused(*self._labels, str(exc))
        self._drop_connection()
        self._after_error(exc)
        delay = backoff_delay(
            exc,
            backoff=self.backoff,
            metrics=self.metrics,
            labels=self._labels,
            connecting=self._connecting(),
            connection_lost=self.connection_lost,
            logger=log,
        )
        # A refused permission's sentence is long and logged once above (backoff_delay): the
        # transition names only its kind.
        why = (
            type(exc).__name__
            if isinstance(exc, PermissionDenied)
            else f"{type(exc).__name__}: {exc}"
        )
        self.machine.to(self._waiting_state(exc), f"{why}; retry in {delay:.1f}s")
        self.stop.wait(delay)

    # --- the one write -----------------------------------------------------------------------

    def _write(
        self,
        records: Sequence[SourceRecord],
        offset: Mapping[str, Any],
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """``records`` and this folder's new cursor ``offset`` in one Kafka transaction."""
        writer = self._writer
        assert writer is not None, "a commit outside run()"
        if before_commit is None:
            writer.write(records, [(self.partition, offset)])
        else:
            writer.write(records, [(self.partition, offset)], before_commit=before_commit)

    def _discard_writer(self) -> None:
        """Close the writer; the next loop creates a new one (and reads the cursor again)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()

    def _release_writer(self) -> None:
        # A fenced producer must not flush: its transactional id belongs to another instance.
        if self.fenced:
            self._writer = None
        self._discard_writer()
