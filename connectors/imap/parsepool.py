"""Mails parsed in other processes, so a backfill is not bound to one core.

Parsing (MIME, charsets, addresses) and Avro encoding are pure Python and cost ~150 µs per 5 KB
mail, about twice what fetching the mail over IMAP costs; one thread (one GIL) does both at a
third of the FETCH rate. A :class:`ParsePool` runs :meth:`RecordBuilder.build_all` for whole
batches in ``parse_workers`` processes while the mailbox thread fetches the next batch and the
previous one commits (see ``MailboxWorker._backfill``).

A job returns once the claim-check blobs of its batch are written (the child commits its own
:class:`~connectors.core.claimcheck.store.ClaimCheckBatch`); the batch's pack file comes back
unsynced and the source's commit fsyncs it between producing the records and committing them
(``before_commit``), so the order "blobs durable, then the transaction that references them
commits" holds as in the single-threaded path while the child goes on parsing. What a job
decides is the default change kind (ADDED, or RESCANNED below the rescan mark); whether a key is
already known to the account (a move or copy: UPDATED) is the account index's to say, in the
parent, which rebuilds those few mails itself.

Children are started with ``spawn`` (the parent has Kafka and IMAP threads; ``fork`` would copy
their locks), ignore Ctrl-C (the parent shuts them down) and exit as soon as the parent is gone,
whenever it dies, so a ``kill -9`` of the source leaves no orphan behind: each child watches
the pipe ``spawn`` starts it with (``multiprocessing.parent_process().sentinel``), whose write
end only the parent holds; its EOF is the parent's death, also when it came before the child
finished starting. multiprocessing's resource tracker (started by the parent for the pool's
semaphores) holds no such pipe of its own: it ends at the EOF of its command pipe, once the
parent and these children, the only holders of the write end, are gone.
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from connectors.core.avro.serde import AvroSerde
from connectors.core.claimcheck.local import LocalClaimCheckBatch
from connectors.core.claimcheck.open import open_configured
from connectors.core.claimcheck.store import ClaimCheckStore
from connectors.core.config import ClaimCheckSettings, KafkaSettings
from connectors.core.mail import ParseLimits, parse_mail
from connectors.imap.connection import FetchedMail
from connectors.imap.errors import ParsePoolClosed
from connectors.imap.indexlog import ChangelogPartition
from connectors.imap.records import ChangeKind, ParsedBatch, RecordBuilder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuilderSpec:
    """Everything a process needs to build the records of one mailbox (picklable)."""

    account: str
    folder: str
    kafka: KafkaSettings
    dlq_topic: str
    max_record_bytes: int
    limits: ParseLimits
    claim_check: ClaimCheckSettings
    claim_check_threads: int
    #: The account's key index changelog partition (indexlog.py); None: no index records.
    index_changelog: ChangelogPartition | None = None

    def cache_key(self) -> tuple[str, str]:
        return (self.account, self.folder)


def make_builder(spec: BuilderSpec, store: ClaimCheckStore | None) -> RecordBuilder:
    """The one way a RecordBuilder is made, in the source and in the pool's children."""
    return RecordBuilder(
        account=spec.account,
        folder=spec.folder,
        parser=functools.partial(parse_mail, limits=spec.limits, claim_check=store),
        serde=AvroSerde.shared("MailEvent", spec.kafka),
        events_topic=spec.kafka.topics.events,
        dlq_topic=spec.dlq_topic,
        max_record_bytes=spec.max_record_bytes,
        claim_check=store,
        index_changelog=spec.index_changelog,
    )


class ParsePool:
    """``parse_workers`` processes shared by every mailbox of a source."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("a parse pool needs at least one process")
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False
        self._lock = threading.Lock()
        #: Set once warm_up() has ended (the processes are up, or their start failed and the
        #: first batch submitted starts them instead).
        self._warmed = threading.Event()

    def submit(
        self, spec: BuilderSpec, mails: Sequence[FetchedMail], uidvalidity: int, rescan_until: int
    ) -> Future[ParsedBatch]:
        """Build ``mails`` in a child; the future's result comes with the batch's blobs durable."""
        batch = list(mails)
        executor = self._running()
        try:
            return executor.submit(_build_batch, spec, batch, uidvalidity, rescan_until)
        except BrokenProcessPool:
            # A child died (OOM killer, a native crash): start a new pool, once.
            log.warning("parse pool broken; starting new processes")
            self._reset(executor)
            return self._running().submit(_build_batch, spec, batch, uidvalidity, rescan_until)

    def warm_up(self) -> None:
        """Start the processes now (spawning and importing takes ~1 s, several on a busy
        machine), not in the middle of the first backfill; :attr:`ready` once it has ended."""
        try:
            executor = self._running()
            for done in [executor.submit(_ready) for _ in range(self.workers)]:
                done.result()
        finally:
            self._warmed.set()

    @property
    def ready(self) -> bool:
        """True once warm_up() has ended: a batch submitted before would wait for the
        processes to start."""
        return self._warmed.is_set()

    def _running(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise ParsePoolClosed("the parse pool is closed")
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_child,
                )
            return self._executor

    def _reset(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = None
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self, wait: bool = True) -> None:
        """Stop the processes; ``wait``: until they have exited. Final: nothing starts again."""
        with self._lock:
            executor, self._executor = self._executor, None
            self._closed = True
        if executor is not None:
            executor.shutdown(wait=wait, cancel_futures=True)


# --- in the child processes ------------------------------------------------------------------

_builders: dict[tuple[str, str], RecordBuilder] = {}
#: The cyclic collector's first threshold in a parse process (CPython's default: 700). A batch
#: keeps its events (dicts and lists) alive until it returns, and each collection of the young
#: generation walked them again: 4-5 % of the CPU of a loop over the bench mail (timed with
#: ``gc.callbacks``), 0.1 % at 10,000 with the modules frozen; a few percent at most in the
#: bench's parse processes, which collect less often than that loop (connectors/imap/README.md).
#: What a batch leaves is freed by reference counting as it returns; the rare cycle (an
#: exception's traceback) is still collected, a little later.
_GC_YOUNG_THRESHOLD = 10_000
_stores: dict[ClaimCheckSettings, ClaimCheckStore] = {}


def _init_child() -> None:
    # The source decides: Ctrl-C stops it (and it closes the pool), SIGHUP reloads its
    # configuration; a signal sent to the whole process group must not end a child behind it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None:  # pragma: no cover - the pool's children are always spawned
        raise RuntimeError("a parse process must be started by multiprocessing")
    threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    # The modules are imported by now (this function's module imports the parser): frozen,
    # the collector never walks them again.
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _exit_with(sentinel: int) -> None:
    """Leave when the source is gone (a ``kill -9`` gives no chance to shut the pool down).

    ``sentinel`` turns readable (EOF) when the parent's end closes, which the kernel does when
    the parent dies, also before this child got here; a getppid() comparison made here would
    miss a parent that died while the child was still importing. Not PR_SET_PDEATHSIG: that
    fires when the *thread* that spawned the child ends.
    """
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _ready() -> None:
    """A job that makes a child start (and import what it needs)."""
    import connectors.core.mail  # noqa: F401


def _builder(spec: BuilderSpec) -> RecordBuilder:
    builder = _builders.get(spec.cache_key())
    if builder is None:
        settings = spec.claim_check
        if settings not in _stores:
            _stores[settings] = open_configured(settings, spec.claim_check_threads)
        builder = _builders[spec.cache_key()] = make_builder(spec, _stores[settings])
    return builder


def _build_batch(
    spec: BuilderSpec, mails: list[FetchedMail], uidvalidity: int, rescan_until: int
) -> ParsedBatch:
    builder = _builder(spec)

    def change(mail: FetchedMail, key: str, _fingerprint: str | None) -> tuple[str, ChangeKind]:
        return key, "RESCANNED" if mail.uid < rescan_until else "ADDED"

    with builder.staged_blobs() as blobs:
        built = builder.build_all(mails, uidvalidity, change, blobs)
        unsynced: list[str] = []
        if isinstance(blobs, LocalClaimCheckBatch):
            # The pack's fsync is the committing thread's (it overlaps the produce there).
            unsynced = blobs.commit(defer_pack_sync=True)
        elif blobs is not None:
            blobs.commit()
        return ParsedBatch(built, tuple(unsynced))


class MailboxParsing:
    """The pool as one mailbox sees it: :meth:`submit` builds a batch of that mailbox."""

    def __init__(self, pool: ParsePool, spec: BuilderSpec) -> None:
        self.pool = pool
        self.spec = spec

    @property
    def workers(self) -> int:
        return self.pool.workers

    @property
    def ready(self) -> bool:
        return self.pool.ready

    def submit(
        self, mails: Sequence[FetchedMail], uidvalidity: int, rescan_until: int
    ) -> Future[ParsedBatch]:
        return self.pool.submit(self.spec, mails, uidvalidity, rescan_until)
