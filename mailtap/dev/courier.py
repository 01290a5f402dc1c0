"""A private Courier IMAP instance: Courier's own ``imapd`` behind our login front end, non-root.

Courier-IMAP is what many hosting providers run: IDLE, UIDPLUS, no CONDSTORE, QRESYNC, MOVE or
ESEARCH. Debian's ``courier-imap`` conflicts with ``dovecot-imapd``, so deploy/bootstrap.sh
unpacks it into ``.cache/imap-servers`` (`IMAPD`); ``courier-base`` brings its libraries.

Courier runs as ``couriertcpd -> imaplogin -> imapd``: ``imaplogin`` checks the password with
``authdaemond`` over a unix socket whose path is compiled into libcourierauth
(``/run/courier/authdaemon/socket``), one per machine, so two private instances (two test
sessions) could not each have their own users. :mod:`mailtap.dev.courier_login` takes the place
of ``couriertcpd`` and ``imaplogin``: it answers CAPABILITY and LOGIN against the instance's
passwd-file, then execs Courier's ``imapd`` exactly as ``imaplogin`` does (``AUTHENTICATED``,
``IMAPLOGINTAG``, the maildir as argument, the ``IMAP_*`` settings of /etc/courier/imapd in the
environment). Everything after LOGIN is Courier's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import dovecot, process
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import REPO_ROOT

#: Courier's IMAP server, unpacked from the Debian package by deploy/bootstrap.sh.
IMAPD = REPO_ROOT / ".cache" / "imap-servers" / "courier-imap" / "usr" / "bin" / "imapd"
START_TIMEOUT_S = 30.0
#: /etc/courier/imapd of Debian's package, minus what belongs to couriertcpd and TLS.
#: IMAP_ENHANCEDIDLE=0: IDLE polls the maildir every IMAP_IDLE_TIMEOUT seconds (with FAM or
#: gamin and ENHANCEDIDLE=1 it is told at once); 10 s instead of the packaged 60 keeps tests short.
IMAPD_SETTINGS = {
    "IMAP_CAPABILITY": "IMAP4rev1 UIDPLUS CHILDREN NAMESPACE THREAD=ORDEREDSUBJECT "
    "THREAD=REFERENCES SORT QUOTA IDLE",
    "IMAP_KEYWORDS": "1",
    "IMAP_ACL": "1",
    "IMAP_IDLE_TIMEOUT": "10",
    "IMAP_ENHANCEDIDLE": "0",
    "IMAP_MAILBOX_SANITY_CHECK": "1",
    "IMAP_DISABLETHREADSORT": "0",
    "IMAP_CHECK_ALL_FOLDERS": "0",
    "IMAP_OBSOLETE_CLIENT": "0",
    "IMAP_UMASK": "022",
    "IMAP_USELOCKS": "1",
    "IMAP_TRASHFOLDERNAME": "Trash",
    "IMAP_EMPTYTRASH": "Trash:7",
    "IMAP_MOVE_EXPUNGE_TO_TRASH": "0",
}


@dataclass(frozen=True)
class CourierLayout:
    root: Path

    @property
    def config(self) -> Path:
        """The login front end's settings (JSON)."""
        return self.root / "courier.json"

    @property
    def accounts_file(self) -> Path:
        return self.root / "passwd"

    @property
    def mail_dir(self) -> Path:
        return self.root / "mail"

    @property
    def log(self) -> Path:
        return self.root / "courier.log"


def layout_for(state_dir: Path) -> CourierLayout:
    return CourierLayout(dovecot.private_root(state_dir, "courier"))


def maildir(layout: CourierLayout, username: str) -> Path:
    return layout.mail_dir / username / "Maildir"


def render(layout: CourierLayout, host: str, port: int) -> None:
    if not IMAPD.exists():
        raise ServiceStartError(
            f"courier: {IMAPD} is missing: run deploy/bootstrap.sh (it installs courier-base "
            "and unpacks courier-imap)"
        )
    mail_user, mail_group = dovecot.mail_identity()
    layout.mail_dir.mkdir(parents=True, exist_ok=True)
    settings = {
        "host": host,
        "port": port,
        "imapd": str(IMAPD),
        "accounts_file": str(layout.accounts_file),
        "mail_dir": str(layout.mail_dir),
        "mail_user": mail_user,
        "imapd_settings": IMAPD_SETTINGS,
    }
    layout.config.write_text(json.dumps(settings, indent=2))
    if os.geteuid() == 0:
        layout.root.chmod(0o755)
        shutil.chown(layout.mail_dir, mail_user, mail_group)
    if not layout.accounts_file.exists():
        add_users(layout, [(u, dovecot.DEFAULT_PASSWORD) for u in dovecot.DEFAULT_USERS])


def add_users(layout: CourierLayout, accounts: list[tuple[str, str]]) -> None:
    """Create (or replace) accounts with an empty maildir; usable when this returns (the front
    end reads the passwd-file at every LOGIN)."""
    mail_user, mail_group = dovecot.mail_identity()
    for username, _ in accounts:
        folder = maildir(layout, username)
        for sub in ("cur", "new", "tmp"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            for path in (folder.parent, folder, *(folder / s for s in ("cur", "new", "tmp"))):
                shutil.chown(path, mail_user, mail_group)
    dovecot.merge_accounts(layout.accounts_file, accounts)


def start(layout: CourierLayout) -> int:
    argv = [sys.executable, "-m", "mailtap.dev.courier_login", str(layout.config)]
    return process.spawn(argv, layout.log)


def wait_ready(layout: CourierLayout, pid: int, host: str, port: int) -> None:
    process.wait_until_ready(
        "courier",
        pid,
        lambda: dovecot.probe(host, port, dovecot.DEFAULT_USERS[0], dovecot.DEFAULT_PASSWORD),
        [layout.log],
        START_TIMEOUT_S,
        interval=0.05,
    )
