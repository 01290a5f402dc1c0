"""A private GreenMail instance: the in-memory mail server Java teams run in their tests.

GreenMail 2.1 (IMAP4rev1, LITERAL+, UIDPLUS, SORT, IDLE, MOVE, QUOTA; no CONDSTORE, QRESYNC or
ESEARCH) keeps mail in memory: a restart loses it. ``build()`` resolves the standalone jar from
Maven Central (``deploy/local/greenmail/pom.xml``) into ``.cache/greenmail/libs``
(``make greenmail``; the test pool builds it on first use). Accounts are created at runtime
through its REST API (``POST /api/user``) and listed in the instance's passwd-file like the
other servers' (`mailtap.dev.imapservers`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import dovecot, process
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import REPO_ROOT, TEMPLATES

POM = TEMPLATES / "greenmail" / "pom.xml"
#: The JVM answers in ~1-2 s here; more on a loaded 2-core CI box.
START_TIMEOUT_S = 60.0
BUILD_TIMEOUT_S = 600.0
JVM_OPTS = ("-Xmx256m", "-Xms32m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")


def home() -> Path:
    return REPO_ROOT / ".cache" / "greenmail"


def libs() -> Path:
    return home() / "libs"


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def _jar() -> Path | None:
    return next(iter(sorted(libs().glob("greenmail-standalone-*.jar"))), None)


def is_installed() -> bool:
    stamp = home() / ".pom-sha256"
    return _jar() is not None and stamp.is_file() and stamp.read_text() == _pom_digest()


def build(force: bool = False) -> Path:
    """Resolve the standalone jar into ``.cache/greenmail/libs`` unless the pom is unchanged."""
    if is_installed() and not force:
        return libs()
    staging = libs().with_name("libs.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    process.maven(
        "greenmail",
        [
            *("-f", str(POM), "dependency:copy-dependencies"),
            *(f"-DoutputDirectory={staging}", "-DincludeScope=runtime"),
        ],
        home() / "build.log",
        BUILD_TIMEOUT_S,
    )
    shutil.rmtree(libs(), ignore_errors=True)
    staging.rename(libs())
    (home() / ".pom-sha256").write_text(_pom_digest())
    return libs()


@dataclass(frozen=True)
class GreenMailLayout:
    root: Path

    @property
    def config(self) -> Path:
        """Where the instance listens (IMAP and the REST API), as JSON."""
        return self.root / "greenmail.json"

    @property
    def accounts_file(self) -> Path:
        return self.root / "passwd"

    @property
    def mail_dir(self) -> Path:
        return self.root  # in memory: nothing on disk

    @property
    def log(self) -> Path:
        return self.root / "greenmail.log"


def layout_for(state_dir: Path) -> GreenMailLayout:
    return GreenMailLayout(dovecot.private_root(state_dir, "greenmail"))


def render(layout: GreenMailLayout, host: str, port: int) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    api_port = process.free_port(host)
    layout.config.write_text(json.dumps({"host": host, "port": port, "api_port": api_port}))
    # GreenMail keeps nothing across a start: the list restarts with the default accounts.
    layout.accounts_file.unlink(missing_ok=True)


def _settings(layout: GreenMailLayout) -> dict[str, object]:
    settings: dict[str, object] = json.loads(layout.config.read_text())
    return settings


def start(layout: GreenMailLayout) -> int:
    jar = _jar()
    if jar is None:
        raise ServiceStartError(
            f"greenmail: not resolved ({libs()} has no jar): run `make greenmail`"
        )
    s = _settings(layout)
    users = ",".join(
        f"{u.partition('@')[0]}:{dovecot.DEFAULT_PASSWORD}@{u.partition('@')[2]}"
        for u in dovecot.DEFAULT_USERS
    )
    argv = [
        process.java("greenmail"),
        *JVM_OPTS,
        f"-Dgreenmail.imap.hostname={s['host']}",
        f"-Dgreenmail.imap.port={s['port']}",
        f"-Dgreenmail.api.hostname={s['host']}",
        f"-Dgreenmail.api.port={s['api_port']}",
        # "local:password@domain", logging in with the whole address as on the other servers.
        f"-Dgreenmail.users={users}",
        "-Dgreenmail.users.login=email",
        "-jar",
        str(jar),
    ]
    pid = process.spawn(argv, layout.log, cwd=layout.root)
    dovecot.merge_accounts(
        layout.accounts_file, [(u, dovecot.DEFAULT_PASSWORD) for u in dovecot.DEFAULT_USERS]
    )
    return pid


def add_users(layout: GreenMailLayout, accounts: list[tuple[str, str]]) -> None:
    """Create accounts through the REST API; each can log in when this returns."""
    s = _settings(layout)
    for username, password in accounts:
        body = json.dumps({"email": username, "login": username, "password": password})
        request = urllib.request.Request(
            f"http://{s['host']}:{s['api_port']}/api/user",
            data=body.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            if answer.status != 200:
                raise RuntimeError(f"greenmail: creating {username} answered {answer.status}")
    dovecot.merge_accounts(layout.accounts_file, accounts)


def probe(layout: GreenMailLayout, host: str, port: int) -> None:
    """Raise unless IMAP accepts a LOGIN and the REST API (started after IMAP) answers."""
    dovecot.probe(host, port, dovecot.DEFAULT_USERS[0], dovecot.DEFAULT_PASSWORD)
    api = f"http://{host}:{_settings(layout)['api_port']}/api/user"
    with urllib.request.urlopen(api, timeout=2) as answer:
        answer.read()


def wait_ready(layout: GreenMailLayout, pid: int, host: str, port: int) -> None:
    process.wait_until_ready(
        "greenmail",
        pid,
        lambda: probe(layout, host, port),
        [layout.log],
        START_TIMEOUT_S,
        interval=0.2,
    )
