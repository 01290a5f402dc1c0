"""Fixtures of the IMAP source tests: a fresh Dovecot account and per-test topics for each test;
``on_server``: the same on each server of the dev stack (``imap_server`` names it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mailtap.dev import Account, DevServices, ImapInfo
from mailtap.dev.imapservers import KINDS
from tests.integration.imap.imap_harness import ImapHarness
from tests.support.imap_servers import ImapServerPool


@pytest.fixture
def imap(
    services: DevServices, imap_account: Account, unique: str, tmp_path: Path
) -> Iterator[ImapHarness]:
    harness = ImapHarness(services, imap_account, unique, tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()


@pytest.fixture(scope="session")
def imap_servers(services: DevServices) -> Iterator[ImapServerPool]:
    pool = ImapServerPool(services)
    yield pool
    left = pool.stop_all()
    if left:
        raise RuntimeError(f"IMAP servers left processes running: {left}")


@pytest.fixture(params=KINDS)
def imap_server(request: pytest.FixtureRequest, imap_servers: ImapServerPool) -> ImapInfo:
    """Each server of the dev stack in turn (`mailtap.dev.imapservers.KINDS`)."""
    return imap_servers.get(request.param)


@pytest.fixture
def on_server(
    services: DevServices, imap_server: ImapInfo, unique: str, tmp_path: Path
) -> Iterator[ImapHarness]:
    """:func:`imap` on ``imap_server``: a fresh account there, per-test topics, and an account
    name of the test's own (tests of several servers run side by side on one broker)."""
    account = Account(f"user-{unique}@example.com", f"pw-{unique}")
    imap_server.add_users([(account.username, account.password)])
    harness = ImapHarness(
        services, account, unique, tmp_path, host=imap_server.host, port=imap_server.port
    )
    harness.account_name = f"{imap_server.kind}-{unique}"
    harness.multiappend = imap_server.kind == "dovecot"
    try:
        yield harness
    finally:
        harness.stop_all()
