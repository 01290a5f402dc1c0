"""Source instances as separate processes sharing mailboxes (imap.group / ews.group), and who owns
what, read from each instance's /healthz the way an operator would."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from connectors.core.source.ownership.group import Placement, WorkUnit, partition_of
from mailtap.dev.process import die_with_parent, free_port

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Instance:
    name: str
    proc: subprocess.Popen[bytes]
    health_port: int
    log: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def health(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:  # 503: stale or fenced, the body still tells
            body = exc.read()
        detail: dict[str, Any] = json.loads(body)
        return detail

    def owned(self) -> set[str] | None:
        """``source/account/folder`` of the mailboxes it runs; None while it cannot answer."""
        try:
            return set(self.health()["mailboxes"])
        except (OSError, ValueError):
            return None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_instance(
    component: str, config: dict[str, Any], tmp: Path, name: str, env: dict[str, str] | None = None
) -> Instance:
    """``mailtap run COMPONENT`` with ``config`` (its own health port), tied to this thread."""
    port = free_port()
    config = {**config, "health": {**config.get("health", {}), "port": port}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp / f"{name}.log"
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "MAILTAP_LOG_LEVEL": "INFO", **(env or {})}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", component, "-c", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO,
            preexec_fn=die_with_parent(),  # a killed test leaves no source behind
        )
    return Instance(name, proc, port, log)


def ownership(instances: Iterable[Instance]) -> dict[str, set[str]] | None:
    """``{instance: owned mailboxes}`` of the live instances; None when one does not answer."""
    found = {}
    for instance in instances:
        if not instance.alive:
            continue
        owned = instance.owned()
        if owned is None:
            return None
        found[instance.name] = owned
    return found


def exactly_once(owned: dict[str, set[str]] | None, expected: set[str]) -> bool:
    """Every expected mailbox is owned by exactly one of the instances, and nothing else."""
    if owned is None:
        return False
    counted: dict[str, int] = {}
    for mailboxes in owned.values():
        for mailbox in mailboxes:
            counted[mailbox] = counted.get(mailbox, 0) + 1
    return set(counted) == expected and all(n == 1 for n in counted.values())


def stop_instances(instances: Iterable[Instance]) -> None:
    instances = list(instances)
    for instance in instances:
        if instance.alive:
            instance.proc.send_signal(signal.SIGTERM)
    for instance in instances:
        try:
            instance.proc.wait(30)
        except subprocess.TimeoutExpired:
            instance.proc.kill()
            instance.proc.wait(10)


def names_covering(
    source: str, placement: Placement, name_of: Callable[[int], str], count: int, partitions: int
) -> list[str]:
    """``count`` account names ``name_of(i)`` whose inboxes cover every work partition (each
    instance of a group owns some)."""
    names: list[str] = []
    covered: set[int] = set()
    for i in itertools.count():
        name = name_of(i)
        p = partition_of(placement(WorkUnit(source, name, "inbox")), partitions)
        if p not in covered or len(covered) == partitions:
            names.append(name)
            covered.add(p)
        if len(names) == count:
            return names
    raise AssertionError("unreachable")


def wait_until(condition: Callable[[], T], what: str, timeout: float) -> T:
    """``condition()``'s first true value within ``timeout`` seconds, else an AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def settled(
    instances: list[Instance],
    expected: set[str],
    timeout: float,
    what: str = "every mailbox owned by exactly one instance",
) -> dict[str, set[str]]:
    """The ownership once every ``expected`` mailbox is owned by exactly one live instance and
    every live instance owns some (one without mailboxes has not joined yet), the same in two
    reads in a row: not a moment inside a rebalance."""
    seen: list[dict[str, set[str]] | None] = [None]

    def check() -> dict[str, set[str]] | None:
        now = ownership(instances)
        ok = now is not None and all(now.values()) and exactly_once(now, expected)
        stable = ok and now == seen[0]
        seen[0] = now
        return now if stable else None

    return wait_until(check, what, timeout)
