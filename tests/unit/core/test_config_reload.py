"""The config reload's decisions, without services: which accounts are added, removed or
changed, which other settings need a restart, what a refused file leaves in place, and how the
mailboxes catalog follows a new set of configured accounts."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.core.config import config_from_dict
from connectors.core.metrics import SourceMetrics
from connectors.core.source.ownership.catalog import ADDED, REMOVED, MailboxCatalog
from connectors.core.source.ownership.group import WorkUnit
from connectors.core.source.reload import ConfigReloader, diff_accounts, needs_restart
from connectors.ews.config import EwsSourceSettings
from connectors.imap.config import ImapSourceSettings


def _account(name: str, **overrides: Any) -> dict[str, Any]:
    return {
        "name": name,
        "host": "imap.example.com",
        "username": f"{name}@example.com",
        "password": f"pw-{name}",
        **overrides,
    }


def _raw(*accounts: dict[str, Any], **imap: Any) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "health": {"port": 0},
        "imap": {"accounts": list(accounts), **imap},
        "smtp": {"host": "relay.example.com"},
    }


def _imap(raw: dict[str, Any]) -> ImapSourceSettings:
    return config_from_dict(raw, env={}).section("imap", ImapSourceSettings)


def test_accounts_are_matched_by_name_into_added_removed_and_changed() -> None:
    old = _imap(_raw(_account("a"), _account("b"), _account("c", folders=["INBOX"])))
    new = _imap(
        _raw(
            _account("a"),  # the same: untouched
            _account("c", folders=["INBOX", "Archive"]),  # folders changed
            _account("d"),
        )
    )
    diff = diff_accounts(old.accounts, new.accounts)
    assert (diff.added, diff.removed, diff.changed) == (("d",), ("b",), ("c",))
    assert str(diff) == ("accounts added: d; removed: b; changed (restarted where they run): c")


@pytest.mark.parametrize(
    "change",
    [{"password": "new-secret"}, {"host": "imap2.example.com"}, {"security": "starttls"}],
)
def test_a_credential_or_server_change_restarts_the_account(change: dict[str, Any]) -> None:
    old = _imap(_raw(_account("a")))
    new = _imap(_raw(_account("a", **change)))
    assert diff_accounts(old.accounts, new.accounts).changed == ("a",)


def test_the_same_accounts_in_another_order_change_nothing() -> None:
    old = _imap(_raw(_account("a"), _account("b")))
    new = _imap(_raw(_account("b"), _account("a")))
    diff = diff_accounts(old.accounts, new.accounts)
    assert not diff
    assert (
        str(diff) == "accounts added: none; removed: none; changed (restarted where they run): none"
    )


def test_only_settings_the_source_reads_besides_its_accounts_need_a_restart() -> None:
    raw = _raw(_account("a"))
    old = config_from_dict(raw, env={})
    changed = _raw(_account("a"), _account("b"), batch_size=50, group={"id": "g"})
    changed["kafka"]["partitions"] = 6
    changed["health"]["max_sync_age_seconds"] = 30
    changed["smtp"]["host"] = "other.example.com"  # not read by the imap source
    new = config_from_dict(changed, env={})
    later = needs_restart(
        old,
        new,
        "imap",
        old.section("imap", ImapSourceSettings),
        new.section("imap", ImapSourceSettings),
    )
    # In the order of the section's fields: those every source has (SourceSettings) first.
    assert later == ["kafka", "health", "imap.group", "imap.batch_size"]
    same = config_from_dict(_raw(_account("b")), env={})
    assert (
        needs_restart(
            old,
            same,
            "imap",
            old.section("imap", ImapSourceSettings),
            same.section("imap", ImapSourceSettings),
        )
        == []
    )


class _Source:
    """What a reload hands the source, recorded."""

    def __init__(self) -> None:
        self.applied: list[ImapSourceSettings] = []

    def reconfigure(self, settings: ImapSourceSettings) -> None:
        self.applied.append(settings)


def _reloader(
    path: Path, raw: dict[str, Any]
) -> tuple[ConfigReloader[ImapSourceSettings], _Source, SourceMetrics]:
    path.write_text(yaml.safe_dump(raw))
    config = config_from_dict(raw, env={}, source=str(path))
    source, metrics = _Source(), SourceMetrics()
    reloader = ConfigReloader(
        str(path),
        "imap",
        ImapSourceSettings,
        config,
        config.section("imap", ImapSourceSettings),
        source.reconfigure,
        metrics,
    )
    return reloader, source, metrics


def _count(metrics: SourceMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "mailtap_config_reloads_total", {"source": "imap", "result": result}
    )
    assert value is not None
    return value


def test_a_reload_applies_the_new_accounts_with_the_running_settings_and_names_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mailtap.yaml"
    reloader, source, metrics = _reloader(path, _raw(_account("a"), batch_size=10))
    path.write_text(yaml.safe_dump(_raw(_account("a"), _account("b"), batch_size=99)))
    with caplog.at_level(logging.INFO, logger="connectors.core.source.reload"):
        assert reloader.reload()
    [applied] = source.applied
    assert [a.name for a in applied.accounts] == ["a", "b"]
    assert applied.batch_size == 10  # not applied: the running value stays
    lines = [r.getMessage() for r in caplog.records]
    assert f"config reload of {path}: accounts added: b; removed: none" in lines[0]
    assert "imap.batch_size changed, which takes effect only after a restart" in lines[1]
    assert not any("pw-" in line for line in lines)  # no secret in any line
    assert (_count(metrics, "ok"), _count(metrics, "failed")) == (1, 0)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("kafka: [unclosed", "not valid YAML"),
        (yaml.safe_dump(_raw(_account("a", security="tls"))), "imap.accounts"),
        (yaml.safe_dump(_raw(_account("a"), _account("a"))), "account names must be unique"),
        (yaml.safe_dump({"kafka": {"bootstrap_servers": "x:1"}}), "imap"),
    ],
)
def test_a_file_that_does_not_validate_changes_nothing_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, says: str
) -> None:
    path = tmp_path / "mailtap.yaml"
    reloader, source, metrics = _reloader(path, _raw(_account("a")))
    path.write_text(content)
    assert not reloader.reload()
    assert source.applied == []
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith(f"config reload of {path} refused, the running configuration stays")
    assert says in line
    assert "pw-a" not in line  # the account's password is never quoted
    assert (_count(metrics, "ok"), _count(metrics, "failed")) == (0, 1)
    # A later good file applies, compared with what runs (not with the refused file).
    path.write_text(yaml.safe_dump(_raw(_account("a"), _account("b"))))
    assert reloader.reload()
    assert [a.name for a in source.applied[0].accounts] == ["a", "b"]


def test_a_source_that_fails_to_apply_counts_a_failed_reload_and_keeps_running(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mailtap.yaml"
    reloader, _, metrics = _reloader(path, _raw(_account("a")))

    def broken(_settings: ImapSourceSettings) -> None:
        raise RuntimeError("boom")

    reloader._reconfigure = broken
    path.write_text(yaml.safe_dump(_raw(_account("b"))))
    assert not reloader.reload()
    assert _count(metrics, "failed") == 1


def test_ews_accounts_diff_the_same_way() -> None:
    def section(*names: str, password: str = "pw") -> EwsSourceSettings:
        accounts = [
            {
                "name": n,
                "service_endpoint": "https://ex.example.com/EWS/Exchange.asmx",
                "email": f"{n}@example.com",
                "auth": "basic",
                "password": password,
            }
            for n in names
        ]
        return EwsSourceSettings.model_validate({"accounts": accounts})

    diff = diff_accounts(section("a", "b").accounts, section("b", "c", password="x").accounts)
    assert (diff.added, diff.removed, diff.changed) == (("c",), ("a",), ("b",))


def test_the_catalog_follows_new_accounts_with_the_topic_changes_on_top() -> None:
    catalog = MailboxCatalog("imap", {"a": ("INBOX",)})
    # A change for an account not configured yet is kept, and applies once it is.
    assert not catalog.record(WorkUnit("imap", "b", "Archive"), ADDED)
    assert catalog.record(WorkUnit("imap", "a", "INBOX"), REMOVED)
    assert catalog.wanted() == frozenset()
    assert catalog.reconfigure({"a": ("INBOX", "Sent"), "b": ("INBOX",)})
    assert catalog.wanted() == {
        WorkUnit("imap", "a", "Sent"),
        WorkUnit("imap", "b", "INBOX"),
        WorkUnit("imap", "b", "Archive"),
    }
    assert catalog.reconfigure({"b": ("INBOX",)})  # a removed: none of its folders is wanted
    assert {u.account for u in catalog.wanted()} == {"b"}
    assert not catalog.reconfigure({"b": ("INBOX",)})


def test_a_request_during_start_up_is_served_once_the_source_runs(tmp_path: Path) -> None:
    path = tmp_path / "mailtap.yaml"
    reloader, source, metrics = _reloader(path, _raw(_account("a")))
    ready, stopping = threading.Event(), threading.Event()
    thread = reloader.follow(ready, stopping)
    path.write_text(yaml.safe_dump(_raw(_account("a"), _account("b"))))
    reloader.request()  # as the SIGHUP handler does, while the source is starting
    time.sleep(1.0)
    assert source.applied == []  # the source is not running yet
    ready.set()
    deadline = time.monotonic() + 10
    while not source.applied and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [a.name for a in source.applied[0].accounts] == ["a", "b"]
    stopping.set()
    thread.join(5)
    assert not thread.is_alive()
    assert _count(metrics, "ok") == 1
