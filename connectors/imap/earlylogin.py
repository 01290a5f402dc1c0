"""IMAP logins started while the source's start-up still waits on Kafka.

A folder worker's session begins with TCP, TLS, LOGIN and ENABLE: several round trips to the
mail server, and on Dovecot a login process and an auth lookup (0.1-0.4 s here). They depend on
nothing of Kafka, yet by the worker's order they came after the start-up's checks of topics and
permissions, the key index load and ``init_transactions``. Started here at the beginning of the
start-up, on a few threads of their own, they overlap those waits, and a worker takes its
folder's session when its own session begins (:meth:`EarlyLogins.take`)::

    early = EarlyLogins(open_session)        # open_session(account) -> a logged-in connection
    early.start(accounts)                    # one login per (account, folder), in the background
    ...                                      # topics, permissions, key indexes, writers
    conn = early.take(account, "INBOX")      # the worker's: logged in, or None (open your own)
    early.close()                            # the logins nobody took: logged out

Nothing of the exactly-once order moves: the cursor is still read after ``init_transactions``,
and SELECT (which carries the cursor's QRESYNC parameters) still follows that read, on the
worker's thread. A session changes threads once, before its first command there: the
future's result is the hand-over, and the worker is its only user from then on (imapclient
is not thread-safe, so never two at a time).

The early login is the worker's first attempt: its session, or its error, which the worker
meets as it would its own (backoff, ``connect_failures``, an ``AuthenticationError`` waits the
cap): a wrong password is not tried twice (retrying would lock the account). A login still
queued behind the others (cancelled), one for other account settings (a reload changed them
meanwhile) or one older than :data:`MAX_AGE_S` is not handed out: the worker opens its own.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import CancelledError, Future

from connectors.imap.config import ImapAccountSettings
from connectors.imap.connection import ImapConnection

__all__ = ["AT_ONCE", "MAX_AGE_S", "EarlyLogins"]

#: Logins in flight at once: a handful covers the first folders of a large instance, whose
#: other workers, started meanwhile, cancel theirs and log in in parallel as they always did.
AT_ONCE = 4
#: A session logged in longer ago than this is not handed out: a worker that backed off first
#: (a refused transactional id) would meet a server that may have timed the idle session out.
MAX_AGE_S = 60.0


class _Login:
    """One folder's early login: its account, its future session, and when it logged in."""

    def __init__(self, account: ImapAccountSettings) -> None:
        self.account = account
        self.session: Future[ImapConnection] = Future()
        self.at = 0.0


class EarlyLogins:
    """Logins of the configured folders, ahead of their workers; see the module docstring."""

    def __init__(self, open_session: Callable[[ImapAccountSettings], ImapConnection]) -> None:
        self._open_session = open_session
        self._queue: queue.SimpleQueue[_Login | None] = queue.SimpleQueue()
        self._threads = 0
        self._lock = threading.Lock()
        self._logins: dict[tuple[str, str], _Login] = {}
        self._closed = False

    def start(self, accounts: Sequence[ImapAccountSettings]) -> None:
        """A login for every folder of ``accounts``, in the background, in this order."""
        with self._lock:
            if self._closed:
                return
            for account in accounts:
                for folder in account.folders:
                    login = _Login(account)
                    self._logins[(account.name, folder)] = login
                    self._queue.put(login)
                    if self._threads < AT_ONCE:
                        self._threads += 1
                        # Daemon threads: a login waiting on an unreachable server (up to the
                        # connect timeout) must not hold the process's exit after SIGTERM or a
                        # refused start, as the worker thread it stands in for would not.
                        threading.Thread(
                            target=self._log_in, name="imap-early-login", daemon=True
                        ).start()

    def _log_in(self) -> None:
        while (login := self._queue.get()) is not None:
            if not login.session.set_running_or_notify_cancel():
                continue  # taken (or dropped) while queued
            try:
                conn = self._open_session(login.account)
            except BaseException as exc:
                login.session.set_exception(exc)
            else:
                login.at = time.monotonic()
                login.session.set_result(conn)

    def take(self, account: ImapAccountSettings, folder: str) -> ImapConnection | None:
        """The folder's logged-in session, once (waiting for a login under way: it is bounded
        by the connection's own timeouts), or None: the caller opens its own. Raises what the
        login raised."""
        with self._lock:
            found = self._logins.pop((account.name, folder), None)
        if found is None:
            return None
        login, future = found, found.session
        if future.cancel():
            return None  # still queued: the worker's own login starts now, not after the queue
        try:
            conn = future.result()
        except CancelledError:
            return None  # closed meanwhile (the source stops)
        if not _same_server_and_login(login.account, account) or _aged(login):
            conn.logout()
            return None
        return conn

    def keep_only(self, folders: Collection[tuple[str, str]]) -> None:
        """Log out of the sessions of every (account, folder) but ``folders`` (those that did
        not start here: the mailboxes topic removed them, or another instance owns them)."""
        with self._lock:
            gone = [key for key in self._logins if key not in folders]
            left = [self._logins.pop(key) for key in gone]
        _drop(left)

    def close(self) -> None:
        """Log out of every session nobody took (a folder that did not start here) and let the
        threads go. Does not wait for a login under way: its thread logs it out at the end."""
        with self._lock:
            self._closed = True
            left = list(self._logins.values())
            self._logins.clear()
            for _ in range(self._threads):
                self._queue.put(None)  # each thread ends after the login it may be in
        _drop(left)


def _same_server_and_login(had: ImapAccountSettings, wanted: ImapAccountSettings) -> bool:
    # The folders may differ (the runtime hands a worker its account with the owned folders
    # only); everything else decides where and as whom the session is.
    return had.model_dump(exclude={"folders"}) == wanted.model_dump(exclude={"folders"})


def _aged(login: _Login) -> bool:
    return time.monotonic() - login.at > MAX_AGE_S


def _drop(logins: Sequence[_Login]) -> None:
    """Cancel what is queued; log out of what logged in, or will (when its login ends)."""
    for login in logins:
        login.session.cancel()
        login.session.add_done_callback(_log_out)


def _log_out(future: Future[ImapConnection]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    with contextlib.suppress(Exception):
        future.result().logout()
