"""Shared fixtures: the real local services, started once per test session.

- ``services``: Kafka (KRaft), Dovecot and the recording SMTP server via `mailtap.dev.up` in a
  temporary state dir, torn down (and checked to leave no process) at the end. The value is a
  `mailtap.dev.DevServices`: ``.kafka.bootstrap_servers``, ``.imap.host/.port/.accounts``,
  ``.smtp.host/.port/.received_dir``, ``.config_path``, and the helpers ``.add_user()``,
  ``.doveadm()``, ``.received_messages()``.
- ``unique``: a short random suffix for topic names, group ids and mailbox users.
- ``imap_account``: a fresh Dovecot account of the session's services, used by no other test.
- ``graph_server``: a fresh Microsoft Graph test server (tests/graph_server) per test, with one
  mailbox and one app registration (``tests.graph_server.fixture``).
- ``s3_server``: S3Proxy (an S3-compatible server, `mailtap.dev.s3proxy`), started on first use;
  ``s3_bucket`` makes a fresh bucket on it and gives its ``claim_check.s3`` settings.

``MAILTAP_KAFKA_BOOTSTRAP=host:port`` uses that Kafka instead of starting one.
``MAILTAP_TEST_STATE_DIR=DIR`` keeps the services in DIR running after the session and reuses
them next time (fast local iterations; ``mailtap dev down --state-dir DIR`` stops them).

At the end of the session, a process the session started that is still alive fails the run,
named with its pid and command line (``tests/support/leftovers.py``); kept services are not
counted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.core.config import S3Settings
from mailtap.dev import Account, DevServices, down, process, s3proxy, up
from mailtap.dev.process import group_members
from tests.graph_server.fixture import graph_server as graph_server
from tests.support.leftovers import keep as keep_past_session
from tests.support.leftovers import pytest_sessionfinish as pytest_sessionfinish
from tests.support.leftovers import pytest_sessionstart as pytest_sessionstart

TESTS_ROOT = Path(__file__).parent
ENV_TEST_STATE_DIR = "MAILTAP_TEST_STATE_DIR"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by folder: tests/integration/** → integration, tests/unit/** → unit."""
    for item in items:
        parts = (
            item.path.relative_to(TESTS_ROOT).parts if item.path.is_relative_to(TESTS_ROOT) else ()
        )
        if parts and parts[0] == "integration":
            item.add_marker(pytest.mark.integration)
        elif parts and parts[0] == "unit":
            item.add_marker(pytest.mark.unit)


#: Set by ``make test`` (and so by CI): a test that would skip fails instead. A skip is for a
#: developer's partial machine (no podman, no Go, registry not built); the test command, which
#: installs everything, must run every test, so a missing tool or server is a failure there.
ENV_NO_SKIP = "MAILTAP_NO_SKIP"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get(ENV_NO_SKIP) == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{ENV_NO_SKIP}=1 (make test): this test may not skip: {reason}"


@pytest.fixture(scope="session")
def services() -> Iterator[DevServices]:
    kept = os.environ.get(ENV_TEST_STATE_DIR)
    if kept:
        info = up(Path(kept))
        keep_past_session(info.pids)  # kept on purpose: not leftovers of this session
        yield info
        return
    # The session's own services end with it, even when pytest is killed -9 (kept ones above do not).
    process.tie_services_to_this_process()
    # World-traversable so Dovecot's unprivileged mail processes can reach the maildirs.
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-test-"))
    state_dir.chmod(0o755)
    info = up(state_dir)
    try:
        yield info
    finally:
        down(state_dir)
        leftovers = {pid: group_members(pid) for pid in info.pids if group_members(pid)}
        if leftovers:
            raise RuntimeError(f"mailtap dev down left processes running: {leftovers}")
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture
def unique() -> str:
    """A short random suffix: ``f"mail.events.{unique}"``, ``f"user-{unique}@example.com"``."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def imap_account(services: DevServices, unique: str) -> Account:
    """A new, empty IMAP account on the session's Dovecot."""
    return services.add_user(f"user-{unique}@example.com", f"pw-{unique}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3proxy.RunningS3Proxy]:
    s3proxy.build()  # a no-op once resolved (`make test` resolves it first)
    state_dir = tmp_path_factory.mktemp("s3proxy")
    running = s3proxy.start(state_dir)
    try:
        yield running
    finally:
        s3proxy.stop(state_dir)


def s3_settings(server: s3proxy.RunningS3Proxy, **overrides: object) -> S3Settings:
    """``claim_check.s3`` for ``server``."""
    values: dict[str, object] = {
        "endpoint_url": server.endpoint,
        "region": "us-east-1",
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
        "connect_timeout_seconds": 2,
        "read_timeout_seconds": 10,
    }
    return S3Settings.model_validate(values | overrides)


@pytest.fixture
def s3_bucket(s3_server: s3proxy.RunningS3Proxy, unique: str) -> tuple[str, S3Settings]:
    """A new, empty bucket on the session's S3Proxy, and the settings that reach it."""
    from connectors.core.claimcheck.s3 import s3_client

    settings = s3_settings(s3_server)
    bucket = f"claims-{unique}"
    s3_client(settings).create_bucket(Bucket=bucket)
    return bucket, settings
