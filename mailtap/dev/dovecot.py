"""A private Dovecot IMAP instance: own config, own base_dir, passwd-file users, non-root mail."""

from __future__ import annotations

import contextlib
import grp
import hashlib
import imaplib
import os
import pwd
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import process
from mailtap.dev.errors import DoveadmError, ServiceStartError
from mailtap.dev.layout import render_template

#: Dovecot starts in ~50 ms here; generous for a loaded machine.
START_TIMEOUT_S = 30.0
DEFAULT_PASSWORD = "secret"
DEFAULT_USERS = (
    "alice@example.com",
    "bob@example.com",
    "demo@example.com",
    "bounces@example.com",
)
#: Dovecot refuses to serve mail as uid 0; as root the mail belongs to this user instead.
ROOT_MAIL_USER = "nobody"


@dataclass(frozen=True)
class DovecotLayout:
    """Files of one Dovecot instance (see `dovecot_root` for where ``root`` lives)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "dovecot.conf"

    @property
    def passwd_file(self) -> Path:
        return self.root / "passwd"

    @property
    def mail_dir(self) -> Path:
        return self.root / "mail"

    @property
    def base_dir(self) -> Path:
        return self.root / "run"

    @property
    def state_dir(self) -> Path:
        return self.root / "lib"

    @property
    def log(self) -> Path:
        return self.root / "dovecot.log"

    @property
    def stdout_log(self) -> Path:
        return self.root / "stdout.log"


def mail_identity() -> tuple[str, str]:
    """(user, group) owning the maildirs and running the imap processes."""
    if os.geteuid() == 0:
        user = pwd.getpwnam(ROOT_MAIL_USER)
        return user.pw_name, grp.getgrgid(user.pw_gid).gr_name
    return pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name


def _reachable_by_others(path: Path) -> bool:
    """True when every existing ancestor of ``path`` lets any user traverse it (o+x)."""
    return all(
        parent.stat().st_mode & stat.S_IXOTH for parent in [path, *path.parents] if parent.exists()
    )


def dovecot_root(state_dir: Path) -> Path:
    """Where the instance keeps config, users, maildirs and logs: ``<state_dir>/dovecot``."""
    return private_root(state_dir, "dovecot")


def private_root(state_dir: Path, name: str) -> Path:
    """Where the IMAP server ``name`` keeps config, users, mail and logs: ``<state_dir>/<name>``.

    As root, the servers' unprivileged processes (Dovecot's auth as `dovecot`, mail as
    `nobody`; Cyrus and Courier as `nobody`) must reach the users and the mail; under a 0700
    directory (pytest's temporary folders) they cannot. The instance then lives in
    /var/tmp/mailtap-dev-<hash of state_dir>/<name> and ``<state_dir>/<name>`` is a symlink to it.
    """
    wanted = state_dir / name
    if os.geteuid() != 0 or _reachable_by_others(state_dir):
        return wanted
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]
    outside = Path("/var/tmp") / f"mailtap-dev-{digest}" / name
    outside.mkdir(parents=True, exist_ok=True)
    outside.parent.chmod(0o755)
    if not wanted.is_symlink():
        state_dir.mkdir(parents=True, exist_ok=True)
        wanted.symlink_to(outside, target_is_directory=True)
    return outside


def layout_for(state_dir: Path) -> DovecotLayout:
    return DovecotLayout(root=dovecot_root(state_dir))


#: ``imap_capability`` of the ``dovecot-minimal`` profile: the bare RFC 3501 minimum (plus
#: UIDPLUS), the way appliances and old servers answer: no IDLE, CONDSTORE, QRESYNC, MOVE, ESEARCH.
MINIMAL_CAPABILITY = "IMAP4rev1 UIDPLUS"


def render(layout: DovecotLayout, host: str, port: int, *, minimal: bool = False) -> None:
    """Write the instance's config; ``minimal`` trims the capabilities to `MINIMAL_CAPABILITY`
    (Dovecot then neither announces nor, for the client's purposes, offers the others)."""
    mail_user, mail_group = mail_identity()
    for folder in (layout.root, layout.base_dir, layout.state_dir):
        folder.mkdir(parents=True, exist_ok=True)
    layout.mail_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        layout.root.chmod(0o755)
        shutil.chown(layout.mail_dir, mail_user, mail_group)
    own_user = pwd.getpwuid(os.geteuid()).pw_name
    values = {
        "host": host,
        "port": str(port),
        "base_dir": str(layout.base_dir),
        "state_dir": str(layout.state_dir),
        "instance": hashlib.sha256(str(layout.root).encode()).hexdigest()[:8],
        "log_path": str(layout.log),
        "internal_user": "dovecot" if os.geteuid() == 0 else own_user,
        "login_user": "dovenull" if os.geteuid() == 0 else own_user,
        "mail_dir": str(layout.mail_dir),
        "passwd_file": str(layout.passwd_file),
        "mail_user": mail_user,
        "mail_group": mail_group,
        "capability": f"imap_capability = {MINIMAL_CAPABILITY}" if minimal else "",
    }
    layout.config.write_text(render_template("dovecot/dovecot.conf.tmpl", values))
    if not layout.passwd_file.exists():
        # Dovecot is not running yet, so no need for add_user's wait.
        _write_passwd(layout.passwd_file, [(u, DEFAULT_PASSWORD) for u in DEFAULT_USERS])


def _check_field(name: str, value: str) -> None:
    if not value or any(c in value for c in ":\r\n\0"):
        raise ValueError(f"{name} must be non-empty and contain no ':', CR, LF or NUL: {value!r}")


def _write_passwd(passwd_file: Path, accounts: list[tuple[str, str]], mtime: int = 0) -> None:
    for username, password in accounts:
        _check_field("username", username)
        _check_field("password", password)
    tmp = passwd_file.with_suffix(".tmp")
    tmp.write_text("".join(f"{u}:{{PLAIN}}{p}\n" for u, p in accounts))
    # Readable by Dovecot's auth process, which runs unprivileged.
    os.chmod(tmp, 0o644)
    if mtime:
        os.utime(tmp, (mtime, mtime))
    tmp.replace(passwd_file)


def add_user(passwd_file: Path, username: str, password: str) -> None:
    """Add (or replace) an IMAP account; it can log in when this returns.

    Dovecot re-reads a passwd-file when its mtime (seconds) or size changed, but checks at most
    once per second (``passwd_file_sync`` in src/auth/db-passwd-file.c): a login in the same
    second as an earlier one would not see the new line. So the file gets a strictly newer mtime
    and this returns only once the wall clock is in a later second than that mtime (<= 1 s).
    """
    add_users(passwd_file, [(username, password)])


def add_users(passwd_file: Path, new: list[tuple[str, str]]) -> None:
    """:func:`add_user` for many accounts in one write (one wait of <= 1 s, not one each)."""
    for username, password in new:
        _check_field("username", username)
        _check_field("password", password)
    names = {u for u, _ in new}
    accounts: list[tuple[str, str]] = []
    old_mtime = 0
    if passwd_file.exists():
        accounts = [(u, p) for u, p in users(passwd_file) if u not in names]
        old_mtime = int(passwd_file.stat().st_mtime)
    mtime = max(int(time.time()), old_mtime + 1)
    _write_passwd(passwd_file, [*accounts, *new], mtime)
    while time.time() < mtime + 1:
        time.sleep(min(0.05, max(0.0, mtime + 1 - time.time())))


def merge_accounts(passwd_file: Path, new: list[tuple[str, str]]) -> None:
    """Add or replace ``new`` in a passwd-file, without :func:`add_users`' wait for Dovecot
    (for the servers that read it at each login, or keep it only as the list of accounts)."""
    names = {u for u, _ in new}
    old = users(passwd_file) if passwd_file.exists() else []
    _write_passwd(passwd_file, [*(a for a in old if a[0] not in names), *new])


def users(passwd_file: Path) -> list[tuple[str, str]]:
    """(username, password) of every account in the passwd-file."""
    accounts = []
    for line in passwd_file.read_text().splitlines():
        if line:
            username, _, secret = line.partition(":")
            accounts.append((username, secret.split(":", 1)[0].removeprefix("{PLAIN}")))
    return accounts


def check_config(layout: DovecotLayout) -> None:
    result = subprocess.run(
        ["dovecot", "-n", "-c", str(layout.config)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ServiceStartError(
            f"dovecot: configuration {layout.config} is invalid:\n{result.stderr}"
        )


def _dovecot_binary() -> str:
    found = shutil.which("dovecot") or (
        "/usr/sbin/dovecot" if Path("/usr/sbin/dovecot").exists() else None
    )
    if not found:
        raise ServiceStartError("dovecot: not installed (Debian package dovecot-imapd)")
    return found


def leftover_master(layout: DovecotLayout) -> int | None:
    """Pid of a Dovecot still running from an earlier start with this base_dir, if any."""
    try:
        pid = int((layout.base_dir / "master.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if process.is_alive(pid) else None


def start(layout: DovecotLayout) -> int:
    binary = _dovecot_binary()
    check_config(layout)
    leftover = leftover_master(layout)
    if leftover is not None:
        raise ServiceStartError(
            f"dovecot: an earlier instance (pid {leftover}) still runs with base_dir "
            f"{layout.base_dir}; stop it (`mailtap dev down` or kill {leftover}) and retry"
        )
    return process.spawn([binary, "-F", "-c", str(layout.config)], layout.stdout_log)


def probe(host: str, port: int, username: str, password: str, timeout: float = 2.0) -> None:
    """Raise unless the server greets and accepts LOGIN for ``username``."""
    client = imaplib.IMAP4(host, port, timeout=timeout)
    try:
        client.login(username, password)
    finally:
        with contextlib.suppress(imaplib.IMAP4.error, OSError):
            client.logout()


def wait_ready(layout: DovecotLayout, pid: int, host: str, port: int) -> None:
    process.wait_until_ready(
        "dovecot",
        pid,
        lambda: probe(host, port, DEFAULT_USERS[0], DEFAULT_PASSWORD),
        [layout.log, layout.stdout_log],
        START_TIMEOUT_S,
        interval=0.05,
    )


DoveadmResult = subprocess.CompletedProcess[str]


def doveadm(config: Path, *args: str, check: bool = True) -> DoveadmResult:
    """Run ``doveadm -c <config> ARGS`` against this instance, e.g.
    ``doveadm(conf, "mailbox", "update", "-u", "alice@example.com", "--uid-validity", "7", "INBOX")``.
    """
    argv = ["doveadm", "-c", str(config), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        raise DoveadmError(result.returncode, argv, result.stdout, result.stderr)
    return result
