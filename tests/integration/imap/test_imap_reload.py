"""A running `mailtap run imap-source -c FILE` reloads its accounts from FILE on SIGHUP: an account
added starts publishing, one with a wrong password restarts once it is fixed, one removed stops
(its mail stays unpublished until it is back), a broken file changes nothing and a later good one
applies. Events are read back with a read_committed consumer; each mail exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from imapclient import IMAPClient

from mailtap.dev import DevServices
from mailtap.dev.process import die_with_parent, free_port
from tests.integration.imap.imap_harness import ImapHarness, make_mail, wait_for
from tests.support.scaleout import REPO, Instance, start_instance, stop_instances


def _reload(source: Instance, config: dict[str, Any], accounts: list[dict[str, Any]]) -> None:
    """Write FILE with ``accounts`` (the instance's health port kept) and send SIGHUP."""
    content = {**config, "health": {**config["health"], "port": source.health_port}}
    content["imap"] = {**config["imap"], "accounts": accounts}
    (source.log.parent / f"{source.name}.yaml").write_text(yaml.safe_dump(content))
    source.proc.send_signal(signal.SIGHUP)


def _reloads(source: Instance, result: str) -> float:
    url = f"http://127.0.0.1:{source.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    prefix = f'mailtap_config_reloads_total{{result="{result}",source="imap"}} '
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


def test_sighup_adds_restarts_and_removes_accounts_of_the_running_source(
    imap: ImapHarness, services: DevServices, unique: str, tmp_path: Path
) -> None:
    imap.account_name = a = f"ra-{unique}"
    b = f"rb-{unique}"
    b_user = services.add_user(f"{b}@example.com", f"pw-{b}")
    config = imap.config_dict(parse_workers=0)
    [account_a] = config["imap"]["accounts"]
    account_b = {**account_a, "name": b, "username": b_user.username, "password": "wrong"}
    key = f"{{}}/mid:{{}}-{unique}@x".format
    published = lambda: {r.key for r in imap.events()}  # noqa: E731 - read_committed, each call

    def to_a(tag: str) -> None:
        imap.append([make_mail(f"{tag}-{unique}@x", tag)])

    def to_b(tag: str) -> None:
        box = IMAPClient(imap.host, port=imap.port, ssl=False)
        box.login(b_user.username, b_user.password)
        box.append("INBOX", make_mail(f"{tag}-{unique}@x", tag))
        box.logout()

    source = start_instance("imap-source", config, tmp_path, "src")
    try:
        to_a("a0")
        wait_for(lambda: key(a, "a0") in published(), "A's first mail")

        # B added, with a wrong password: it runs (listed, in BACKOFF) and publishes nothing.
        to_b("b0")
        _reload(source, config, [account_a, account_b])
        wait_for(
            lambda: source.health()["states"].get(f"imap/{b}/INBOX") == "BACKOFF",
            "B in BACKOFF with the wrong password",
        )
        assert source.owned() == {f"imap/{a}/INBOX", f"imap/{b}/INBOX"}
        assert key(b, "b0") not in published()

        # B's password fixed: B restarts with it and publishes; A keeps working.
        account_b["password"] = b_user.password
        _reload(source, config, [account_a, account_b])
        wait_for(lambda: key(b, "b0") in published(), "B's mail after the password fix")
        to_a("a1")
        wait_for(lambda: key(a, "a1") in published(), "A's mail after the reloads")

        # A removed: its worker stops; its new mail stays unpublished, B's is published.
        signalled = time.monotonic()
        _reload(source, config, [account_b])
        wait_for(lambda: source.owned() == {f"imap/{b}/INBOX"}, "A stopped")
        print(
            f"\nSIGHUP -> removed account gone from /healthz: {time.monotonic() - signalled:.2f}s"
        )
        to_a("a2")
        to_b("b1")
        wait_for(lambda: key(b, "b1") in published(), "B's mail after A left")
        time.sleep(2)  # A's worker was stopped before a2 arrived
        assert key(a, "a2") not in published()

        # A broken file: one error sentence, nothing changes, the process runs on.
        (tmp_path / "src.yaml").write_text("imap: [this is not: the configuration")
        source.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "refused, the running configuration stays" in source.log_text(), "the log")
        [line] = [x for x in source.log_text().splitlines() if "refused, the running" in x]
        assert "src.yaml" in line and "not valid YAML" in line, line
        assert source.alive and source.owned() == {f"imap/{b}/INBOX"}

        # A later good file applies: A is back and catches up with a2 from its cursor.
        signalled = time.monotonic()
        _reload(source, config, [account_a, account_b])
        wait_for(lambda: key(a, "a2") in published(), "A's mail once it is back")
        print(
            f"SIGHUP -> the added account's waiting mail on mail.events: "
            f"{time.monotonic() - signalled:.2f}s"
        )
        assert source.owned() == {f"imap/{a}/INBOX", f"imap/{b}/INBOX"}
        assert (_reloads(source, "ok"), _reloads(source, "failed")) == (4, 1)

        # The only account replaced by another: the process runs on (the workers it had were
        # stopped by the change, they did not end by themselves as fenced ones do).
        _reload(source, config, [account_b])
        wait_for(lambda: source.owned() == {f"imap/{b}/INBOX"}, "A stopped again")
        _reload(source, config, [account_a])
        wait_for(lambda: source.owned() == {f"imap/{a}/INBOX"}, "B replaced by A")
        to_a("a3")
        wait_for(lambda: key(a, "a3") in published(), "A's mail after the replacement")
        assert b_user.password not in source.log_text()
        assert source.alive
    finally:
        stop_instances([source])
    keys = [r.key for r in imap.events()]
    assert sorted(keys) == sorted({*keys}), "a mail was published twice"
    log = source.log_text()
    assert f"accounts added: {b}; removed: none" in log
    assert f"accounts added: none; removed: none; changed (restarted where they run): {b}" in log
    assert f"accounts added: none; removed: {a};" in log


def _parse_children(pid: int) -> set[int]:
    """The parse processes of the source ``pid`` (multiprocessing spawn children) that have
    started: they ignore SIGINT (their initializer ran)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread or a child may end between the listing and the read
            for child in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                if b"multiprocessing.spawn" in cmdline and b"resource_tracker" not in cmdline:
                    status = Path(f"/proc/{child}/status").read_text().splitlines()
                    [ignored] = [x.split()[1] for x in status if x.startswith("SigIgn")]
                    if int(ignored, 16) & (1 << (signal.SIGINT - 1)):
                        found.add(int(child))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def test_sighup_to_the_process_group_reloads_and_leaves_the_parse_processes_running(
    imap: ImapHarness, unique: str, tmp_path: Path
) -> None:
    """A hang-up of the whole group (a terminal closing, `kill -HUP -PGID`) is a reload for the
    source and nothing for its parse processes, which stay and parse the next backfill."""
    imap.account_name = f"rg-{unique}"
    config = imap.config_dict(parse_workers=1)
    config["health"]["port"] = free_port()
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "group.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO), "MAILTAP_LOG_LEVEL": "INFO"},
            cwd=REPO,
            start_new_session=True,  # its own process group, as under a terminal
            preexec_fn=die_with_parent(),
        )
    source = Instance("group", proc, config["health"]["port"], log)

    def published() -> set[str]:
        return {r.key for r in imap.events() if r.key is not None}

    try:
        children = wait_for(lambda: _parse_children(proc.pid), "the parse process")
        os.killpg(proc.pid, signal.SIGHUP)
        wait_for(lambda: "accounts added: none" in source.log_text(), "the reload")
        assert source.alive and _parse_children(proc.pid) == children
        ids = imap.append_numbered(25)  # more than one batch: parsed in the parse process
        wait_for(lambda: {f"{imap.account_name}/mid:{i}" for i in ids} <= published(), "the mails")
        assert _parse_children(proc.pid) == children
    finally:
        stop_instances([source])
