"""Services the test session starts itself are covered by the end-of-session leftover check
(``tests/support/leftovers.py``) until ``down()`` stops them: the SMTP server carries the
session's id, Dovecot's master (which writes its process titles over that) is a child of the
pytest process, and Dovecot's children (a cleaned environment) are in the session it leads."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from mailtap.dev import DevServices, down, up
from mailtap.dev.process import group_members
from tests.support import leftovers


def test_services_the_session_starts_are_leftovers_until_they_are_down(
    services: DevServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = os.environ[leftovers.RUN_ENV]  # set at session start
    # Dovecot and the SMTP server of a set of our own; the session's broker stands in for Kafka.
    monkeypatch.setenv("MAILTAP_KAFKA_BOOTSTRAP", services.bootstrap_servers)
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-test-leftovers-"))
    state_dir.chmod(0o755)  # Dovecot's unprivileged processes must reach it
    try:
        info = up(state_dir)
        members = {pid for pgid in info.pids for pid in group_members(pgid)}
        assert len(members) > len(info.pids)  # Dovecot forked its helpers
        found = {left.pid for left in leftovers.find_leftovers(run_id, root_pid=os.getpid())}
        assert members <= found
        # Kept on purpose (MAILTAP_TEST_STATE_DIR), the same services would not count.
        kept = leftovers.find_leftovers(run_id, root_pid=os.getpid(), ignore_groups=info.pids)
        assert members.isdisjoint(left.pid for left in kept)
    finally:
        down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
    after = leftovers.find_leftovers(run_id, root_pid=os.getpid())
    assert members.isdisjoint(left.pid for left in after)
