"""Fixtures of the IMAP source tests: a fresh Dovecot account and per-test topics for each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mailtap.dev import Account, DevServices
from tests.integration.imap.imap_harness import ImapHarness


@pytest.fixture
def imap(
    services: DevServices, imap_account: Account, unique: str, tmp_path: Path
) -> Iterator[ImapHarness]:
    harness = ImapHarness(services, imap_account, unique, tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()
