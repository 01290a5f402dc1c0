"""A private Postfix instance on a loopback port, relaying everything to a given next hop.

Used to check that a real MTA accepts what the sink renders (and forwards it intact). Layout
follows PITFALLS.md: its own ``main.cf``/``master.cf``, chroot ``n``, no local delivery, loopback
only. Postfix refuses to run without root (its master drops to ``mail_owner``), so the tests that
use it skip elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from mailtap.dev.process import free_port

POSTFIX = shutil.which("postfix") or "/usr/sbin/postfix"
START_TIMEOUT_S = 30.0

MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup    unix  n - n 60 1 pickup
cleanup   unix  n - n - 0 cleanup
qmgr      unix  n - n 300 1 qmgr
rewrite   unix  - - n - - trivial-rewrite
bounce    unix  - - n - 0 bounce
defer     unix  - - n - 0 bounce
trace     unix  - - n - 0 bounce
verify    unix  - - n - 1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n - - proxymap
smtp      unix  - - n - - smtp
relay     unix  - - n - - smtp
showq     unix  n - n - - showq
error     unix  - - n - - error
retry     unix  - - n - - error
discard   unix  - - n - - discard
anvil     unix  - - n - 1 anvil
scache    unix  - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
"""

MAIN_CF = """\
compatibility_level = 3.6
queue_directory = {root}/queue
data_directory = {root}/data
command_directory = /usr/sbin
daemon_directory = /usr/lib/postfix/sbin
mail_owner = postfix
setgid_group = postdrop
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = postfix.mailtap.test
mydomain = mailtap.test
myorigin = $myhostname
mydestination =
local_recipient_maps =
alias_maps =
alias_database =
mynetworks = 127.0.0.0/8
relayhost = [127.0.0.1]:{relay_port}
smtpd_relay_restrictions = permit_mynetworks, reject
smtp_tls_security_level = none
smtpd_tls_security_level = none
smtputf8_enable = {smtputf8}
biff = no
maillog_file = {root}/postfix.log
maillog_file_prefixes = {root}
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
"""


class PrivatePostfix:
    """``with PrivatePostfix(root, relay_port) as pf: pf.port`` -- started in the foreground."""

    def __init__(self, root: Path, relay_port: int, *, smtputf8: bool = False) -> None:
        self.root = root
        self.smtputf8 = smtputf8
        self.relay_port = relay_port
        self.port = free_port()
        self._master: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and Path(POSTFIX).exists()

    def _write(self) -> None:
        for sub in ("queue", "data"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        shutil.chown(self.root / "data", "postfix", "postfix")
        self.root.chmod(0o755)
        (self.root / "main.cf").write_text(
            MAIN_CF.format(
                root=self.root,
                relay_port=self.relay_port,
                smtputf8="yes" if self.smtputf8 else "no",
            )
        )
        (self.root / "master.cf").write_text(MASTER_CF.format(port=self.port))

    def __enter__(self) -> PrivatePostfix:
        self._write()
        subprocess.run(
            [POSTFIX, "-c", str(self.root), "set-permissions"], check=False, capture_output=True
        )
        log = (self.root / "master.out").open("ab")
        self._master = subprocess.Popen(
            [POSTFIX, "-c", str(self.root), "start-fg"], stdout=log, stderr=log
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._master.poll() is not None:
                raise RuntimeError(f"postfix exited: {self.log_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    if sock.recv(512).startswith(b"220"):
                        return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"postfix did not answer on {self.port}: {self.log_text()}")

    def log_text(self) -> str:
        parts = [
            p.read_text(errors="replace")
            for p in (self.root / "master.out", self.root / "postfix.log")
            if p.exists()
        ]
        return "\n".join(parts)

    def __exit__(self, *exc: object) -> None:
        subprocess.run([POSTFIX, "-c", str(self.root), "stop"], check=False, capture_output=True)
        if self._master is not None:
            try:
                self._master.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._master.kill()
                self._master.wait()
