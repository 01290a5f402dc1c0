"""``mailtap status -c CONFIG --json`` with two IMAP source processes in a group: every mailbox of
the configuration is listed once, with the member that owns it (the instance whose /healthz runs
it), its worker state and the age of its last sync; without --health the age is the cursor's."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from imapclient import IMAPClient

from connectors.core.source.ownership.group import partition_of
from mailtap.dev import DevServices
from tests.integration.imap.imap_harness import ImapHarness, make_mail, wait_for
from tests.support.scaleout import REPO, exactly_once, ownership, start_instance, stop_instances

PARTITIONS = 2  # one per member: both instances own mailboxes
ACCOUNTS = 4


def _account_names(unique: str) -> list[str]:
    """Four names covering both work partitions."""
    names: list[str] = []
    for i in itertools.count():
        name = f"st{i}-{unique}"
        covered = {partition_of(n, PARTITIONS) for n in names}
        if partition_of(name, PARTITIONS) not in covered or len(covered) == PARTITIONS:
            names.append(name)
        if len(names) == ACCOUNTS:
            return names
    raise AssertionError("unreachable")


def _status(config: Path, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "mailtap.cli", "status", "-c", str(config), "--json", *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_status_names_each_mailboxs_owner_once_with_state_and_age(
    imap: ImapHarness, services: DevServices, unique: str, tmp_path: Path
) -> None:
    names = _account_names(unique)
    accounts = {}
    for name in names:
        account = services.add_user(f"{name}@example.com", f"pw-{name}")
        accounts[name] = account
        client = IMAPClient(imap.host, port=imap.port, ssl=False)
        client.login(account.username, account.password)
        client.append("INBOX", make_mail(f"st-{name}@example.com", "status"))
        client.logout()
    expected = {f"imap/{n}/INBOX" for n in names}
    config = imap.config_dict(parse_workers=0)
    template = config["imap"]["accounts"][0]
    config["imap"]["accounts"] = [
        {**template, "name": n, "username": a.username, "password": a.password}
        for n, a in accounts.items()
    ]
    config["imap"]["group"] = {
        "id": f"status-group-{unique}",
        "work_topic": f"mailtap.imap-work.{unique}",
        "work_partitions": PARTITIONS,
        "session_timeout_seconds": 6,
    }
    status_config = tmp_path / "status.yaml"
    status_config.write_text(yaml.safe_dump({k: v for k, v in config.items() if k != "health"}))

    instances = [start_instance("imap-source", config, tmp_path, f"s{n}") for n in range(2)]
    try:

        def settled() -> dict[str, set[str]] | None:
            time.sleep(0.5)
            now = ownership(instances)
            ok = now is not None and all(now.values()) and exactly_once(now, expected)
            return now if ok else None

        owned = wait_for(settled, "4 mailboxes split over two instances", timeout=120)
        pid_of = {i.name: str(i.proc.pid) for i in instances}
        urls = [f"http://127.0.0.1:{i.health_port}/healthz" for i in instances]

        def synced() -> dict[str, Any] | None:
            report = _status(status_config, *(a for u in urls for a in ("--health", u)))
            boxes = report["mailboxes"]
            ready = all(
                boxes.get(m, {}).get("state") == "IDLE" and boxes[m]["owner"] for m in expected
            )
            return report if ready else None

        report = wait_for(synced, "status shows every mailbox IDLE with an owner", timeout=90)
        listed = {m: b for m, b in report["mailboxes"].items() if b.get("origin")}
        assert set(listed) == expected
        owners_seen = set()
        for mailbox, box in listed.items():
            runner = [n for n, boxes in owned.items() if mailbox in boxes]
            assert len(runner) == 1, (mailbox, owned)
            assert box["owner"].endswith(f":{pid_of[runner[0]]}"), (mailbox, box, pid_of)
            assert box["owner"].startswith("mailtap-imap@")
            owners_seen.add(box["owner"])
            assert box["age_of"] == "healthz"
            assert 0 <= box["last_sync_age_seconds"] < 120, box
        assert len(owners_seen) == 2

        # From Kafka alone: the same owners, the age of each mailbox's committed cursor.
        def cursors() -> dict[str, Any] | None:
            boxes = _status(status_config)["mailboxes"]
            ready = all(boxes.get(m, {}).get("age_of") == "cursor" for m in expected)
            return boxes if ready else None

        boxes = wait_for(cursors, "a cursor for every mailbox", timeout=90)
        for mailbox in expected:
            assert boxes[mailbox]["owner"] == listed[mailbox]["owner"]
            assert boxes[mailbox]["state"] is None
            assert 0 <= boxes[mailbox]["last_sync_age_seconds"] < 300, boxes[mailbox]
            assert boxes[mailbox]["cursor"] is not None
    finally:
        stop_instances(instances)
