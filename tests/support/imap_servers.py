"""Every IMAP server of the dev stack for one test session: Dovecot is the session's own
(`services`), the others start on first use, next to the session's Kafka, and stop at its end.

A test gets an ``ImapInfo``: ``.host``, ``.port``, ``.kind`` and ``.add_users(...)``, the same
interface as the session's Dovecot; mail goes in over IMAP (APPEND) on every kind.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mailtap.dev import DevServices, ImapInfo, greenmail, imapservers, process

HOST = "127.0.0.1"


class ImapServerPool:
    def __init__(self, services: DevServices) -> None:
        self.services = services
        self._started: dict[str, ImapInfo] = {}
        self._state_dirs: list[Path] = []

    def get(self, kind: str) -> ImapInfo:
        """The server of ``kind``, started now if this session has none yet."""
        if kind == self.services.imap.kind:
            return self.services.imap
        if kind not in self._started:
            # World-traversable, like the session's state dir: the servers' unprivileged
            # processes read their users and mail under it.
            state_dir = Path(tempfile.mkdtemp(prefix=f"mailtap-{kind}-"))
            state_dir.chmod(0o755)
            self._state_dirs.append(state_dir)
            port = process.free_port(HOST)
            if kind == "greenmail":
                greenmail.build()  # a no-op once resolved (`make test` resolves it first)
            started = imapservers.start(kind, state_dir, HOST, port)
            self._started[kind] = ImapInfo(
                host=HOST,
                port=port,
                accounts=tuple(),
                pid=started.pid,
                log_path=started.log_path,
                config_path=started.config_path,
                passwd_file=started.passwd_file,
                mail_dir=started.mail_dir,
                kind=kind,
            )
        return self._started[kind]

    def stop_all(self) -> list[str]:
        """Stop every server this pool started; returns what each left running (none: [])."""
        left = []
        for kind, info in self._started.items():
            process.stop_group(info.pid)
            if process.group_members(info.pid):
                left.append(f"{kind}: {process.group_members(info.pid)}")
        self._started.clear()
        for state_dir in self._state_dirs:
            shutil.rmtree(state_dir, ignore_errors=True)
        return left
