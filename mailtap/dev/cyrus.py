"""A private Cyrus IMAP 3.x instance: own imapd.conf and cyrus.conf, own SASL database, non-root.

Cyrus is the other big IMAP implementation (Fastmail, universities): CONDSTORE, QRESYNC, MOVE,
ESEARCH, IDLE like Dovecot, but its own code for each. Debian's ``cyrus-imapd`` conflicts with
``dovecot-imapd``, so deploy/bootstrap.sh unpacks its daemons into ``.cache/imap-servers``
(`IMAPD_ROOT`) and installs ``cyrus-common`` (the ``master`` process, ``ctl_cyrusdb``) and
``sasl2-bin`` (``saslpasswd2``) as packages.

What a minimal private instance needs (from the packages' /etc/imapd.conf and /etc/cyrus.conf):
``configdirectory``, ``partition-default``, the ``proc_path``/lock/socket paths under its own
root, a ``cyrus_user`` that is not root, a SASL database for the users, ``autocreate_quota: 0``
so INBOX exists after the first login, and a cyrus.conf with ``ctl_cyrusdb -r`` at START, the
``imapd`` service on our port and ``idled`` (IDLE notifications) as a DAEMON.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import dovecot, process
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import REPO_ROOT, render_template

#: Where deploy/bootstrap.sh unpacks the ``cyrus-imapd`` package (imapd, idled).
IMAPD_ROOT = REPO_ROOT / ".cache" / "imap-servers" / "cyrus-imapd"
#: ``cyrus-common``'s binaries (master, ctl_cyrusdb), installed as a Debian package.
COMMON_BIN = Path("/usr/lib/cyrus/bin")
START_TIMEOUT_S = 60.0
#: The instance's administrator (in the SASL database, never a mailbox owner).
ADMIN = "cyrusadmin"


@dataclass(frozen=True)
class CyrusLayout:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "imapd.conf"

    @property
    def master_config(self) -> Path:
        return self.root / "cyrus.conf"

    @property
    def sasldb(self) -> Path:
        return self.root / "sasldb2"

    @property
    def accounts_file(self) -> Path:
        """Every account with its password, in Dovecot's passwd-file format (for listing)."""
        return self.root / "passwd"

    @property
    def mail_dir(self) -> Path:
        return self.root / "spool"

    @property
    def log(self) -> Path:
        return self.root / "cyrus.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "run" / "master.pid"


def layout_for(state_dir: Path) -> CyrusLayout:
    return CyrusLayout(dovecot.private_root(state_dir, "cyrus"))


def _binary(path: Path) -> str:
    if not path.exists():
        raise ServiceStartError(
            f"cyrus: {path} is missing: run deploy/bootstrap.sh (it installs cyrus-common and "
            f"sasl2-bin and unpacks cyrus-imapd into {IMAPD_ROOT})"
        )
    return str(path)


def render(layout: CyrusLayout, host: str, port: int) -> None:
    mail_user, mail_group = dovecot.mail_identity()
    root = layout.root
    for sub in ("lib/socket", "spool", "sieve", "run/proc", "run/lock"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    imapd_bin = IMAPD_ROOT / "usr" / "lib" / "cyrus" / "bin"
    values = {
        "root": str(root),
        "instance": hashlib.sha256(str(root).encode()).hexdigest()[:8],
        "mail_user": mail_user,
        "admin": ADMIN,
        "sasldb": str(layout.sasldb),
        "config": str(layout.config),
        "bin": str(COMMON_BIN),
        "imapd": _binary(imapd_bin / "imapd"),
        "idled": _binary(imapd_bin / "idled"),
        "host": host,
        "port": str(port),
    }
    layout.config.write_text(render_template("cyrus/imapd.conf.tmpl", values))
    layout.master_config.write_text(render_template("cyrus/cyrus.conf.tmpl", values))
    if not layout.accounts_file.exists():
        add_users(layout, [(u, dovecot.DEFAULT_PASSWORD) for u in dovecot.DEFAULT_USERS])
    _saslpasswd(layout, ADMIN, hashlib.sha256(str(root).encode()).hexdigest())
    if os.geteuid() == 0:
        # Cyrus runs as ``mail_user``: it owns the whole instance (it writes to most of it).
        for path in [root, *root.rglob("*")]:
            shutil.chown(path, mail_user, mail_group)
        root.chmod(0o755)


def _saslpasswd(layout: CyrusLayout, username: str, password: str) -> None:
    user, _, domain = username.partition("@")
    argv = [shutil.which("saslpasswd2") or "/usr/sbin/saslpasswd2", "-c", "-p"]
    argv += ["-f", str(layout.sasldb)]
    if domain:
        argv += ["-u", domain]  # the realm Cyrus asks for with virtdomains: userid
    result = subprocess.run(
        [*argv, user], input=password, capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"saslpasswd2 for {username} failed: {result.stderr.strip()}")
    # Read by the imapd processes, which run as the mail user.
    layout.sasldb.chmod(0o644)


def add_users(layout: CyrusLayout, accounts: list[tuple[str, str]]) -> None:
    """Create (or replace) accounts; each can log in when this returns (INBOX is created at the
    first login)."""
    for username, password in accounts:
        _saslpasswd(layout, username, password)
    dovecot.merge_accounts(layout.accounts_file, accounts)


def start(layout: CyrusLayout) -> int:
    master = _binary(COMMON_BIN / "master")
    leftover = leftover_master(layout)
    if leftover is not None:
        raise ServiceStartError(
            f"cyrus: an earlier master (pid {leftover}) still runs from {layout.root}; stop it "
            f"(`mailtap dev down` or kill {leftover}) and retry"
        )
    # master stays in the foreground without -d; its services log to syslog and stderr.
    argv = [master, "-C", str(layout.config), "-M", str(layout.master_config)]
    # As root, started as the mail user rather than left to drop root itself: that change of
    # user would clear the tie to the test session (PR_SET_PDEATHSIG, process.spawn).
    user = dovecot.mail_identity()[0] if os.geteuid() == 0 else None
    return process.spawn([*argv, "-p", str(layout.pid_file)], layout.log, user=user)


def leftover_master(layout: CyrusLayout) -> int | None:
    try:
        pid = int(layout.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if process.is_alive(pid) else None


def wait_ready(layout: CyrusLayout, pid: int, host: str, port: int) -> None:
    process.wait_until_ready(
        "cyrus",
        pid,
        lambda: dovecot.probe(host, port, dovecot.DEFAULT_USERS[0], dovecot.DEFAULT_PASSWORD),
        [layout.log],
        START_TIMEOUT_S,
        interval=0.1,
    )
