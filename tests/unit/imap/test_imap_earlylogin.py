"""The IMAP logins started ahead of the workers (connectors.imap.earlylogin): a worker gets its
folder's session logged in, or nothing (and opens its own, meeting any error where it always
did); a session nobody takes is logged out."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from connectors.core.errors import AuthenticationError
from connectors.imap import earlylogin
from connectors.imap.config import ImapAccountSettings
from connectors.imap.earlylogin import EarlyLogins


def account(name: str = "a", folders: tuple[str, ...] = ("INBOX",), **kw: Any) -> Any:
    return ImapAccountSettings.model_validate(
        {"name": name, "host": "h", "username": "u", "password": "p", "folders": folders, **kw}
    )


class Session:
    def __init__(self, acct: ImapAccountSettings) -> None:
        self.account = acct
        self.thread = threading.current_thread().name
        self.logged_out = threading.Event()

    def logout(self) -> None:
        self.logged_out.set()


class Server:
    """open_session: records every login; ``hold`` keeps logins waiting, ``refuse`` fails them."""

    def __init__(self) -> None:
        self.opened: list[Session] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Semaphore(0)
        self.refuse: Exception | None = None

    def open_session(self, acct: ImapAccountSettings) -> Any:
        self.entered.release()
        assert self.hold.wait(10)
        if self.refuse is not None:
            raise self.refuse
        session = Session(acct)
        self.opened.append(session)
        return session


def test_a_worker_takes_its_folders_session_logged_in_on_another_thread_once() -> None:
    server = Server()
    early = EarlyLogins(server.open_session)
    acct = account(folders=("INBOX", "Sent"))
    early.start([acct])
    assert server.entered.acquire(timeout=10) and server.entered.acquire(timeout=10)
    inbox = early.take(acct, "INBOX")
    assert isinstance(inbox, Session) and inbox.thread.startswith("imap-early-login")
    # The runtime hands a worker its account with the owned folders only: the same login.
    sent = early.take(acct.model_copy(update={"folders": ("Sent",)}), "Sent")
    assert isinstance(sent, Session) and sent is not inbox
    assert early.take(acct, "INBOX") is None  # a reconnect opens its own
    assert early.take(account("other"), "INBOX") is None  # never started
    early.close()
    assert not inbox.logged_out.is_set()  # taken: the worker's now


def test_a_failed_login_is_the_workers_first_attempt_a_wrong_password_is_not_tried_twice() -> None:
    server = Server()
    server.refuse = AuthenticationError("imap login refused for acct")
    early = EarlyLogins(server.open_session)
    early.start([account()])
    assert server.entered.acquire(timeout=10)
    with pytest.raises(AuthenticationError):
        early.take(account(), "INBOX")
    assert early.take(account(), "INBOX") is None  # the next attempt is the worker's own
    assert not server.entered.acquire(timeout=0.2)  # one login only
    early.close()


def test_a_login_still_queued_is_cancelled_so_the_worker_does_not_wait_behind_others() -> None:
    server = Server()
    server.hold.clear()
    early = EarlyLogins(server.open_session)
    accounts = [account(f"a{i}") for i in range(earlylogin.AT_ONCE + 1)]
    early.start(accounts)
    for _ in range(earlylogin.AT_ONCE):
        assert server.entered.acquire(timeout=10)
    assert early.take(accounts[-1], "INBOX") is None  # queued behind AT_ONCE logins
    server.hold.set()
    taken = [early.take(a, "INBOX") for a in accounts[:-1]]
    assert all(isinstance(s, Session) for s in taken)
    early.close()
    assert sorted(s.account.name for s in server.opened) == [a.name for a in accounts[:-1]]


def test_a_session_for_changed_settings_or_too_old_is_logged_out_not_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = Server()
    early = EarlyLogins(server.open_session)
    early.start([account("a"), account("b")])
    assert server.entered.acquire(timeout=10) and server.entered.acquire(timeout=10)
    # A reload changed a's login meanwhile: the session opened with the old one is dropped.
    assert early.take(account("a", username="u2"), "INBOX") is None
    monkeypatch.setattr(earlylogin, "MAX_AGE_S", 0.0)
    time.sleep(0.01)
    assert early.take(account("b"), "INBOX") is None
    assert len(server.opened) == 2
    assert all(s.logged_out.wait(5) for s in server.opened)
    early.close()


def test_sessions_nobody_takes_are_logged_out_even_one_still_logging_in() -> None:
    server = Server()
    early = EarlyLogins(server.open_session)
    early.start([account("kept"), account("removed")])
    assert server.entered.acquire(timeout=10) and server.entered.acquire(timeout=10)
    deadline = time.monotonic() + 10
    while len(server.opened) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    early.keep_only({("kept", "INBOX")})  # "removed" did not start here
    removed = next(s for s in server.opened if s.account.name == "removed")
    assert removed.logged_out.wait(5)
    server.hold.clear()
    early.start([account("late")])
    assert server.entered.acquire(timeout=10)
    early.close()  # "kept" was never taken; "late" is still logging in
    server.hold.set()
    kept = next(s for s in server.opened if s.account.name == "kept")
    assert kept.logged_out.wait(5)
    deadline = time.monotonic() + 10
    while len(server.opened) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    late = next(s for s in server.opened if s.account.name == "late")
    assert late.logged_out.wait(5)
    assert early.take(account("kept"), "INBOX") is None
