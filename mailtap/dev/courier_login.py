"""The login front end of the private Courier instance (``python -m mailtap.dev.courier_login
SETTINGS.json``): listens, greets, answers CAPABILITY / NOOP / LOGOUT / LOGIN, and on a good
LOGIN execs Courier's ``imapd`` on the connection, as Courier's ``imaplogin`` does.

Why it exists: :mod:`mailtap.dev.courier`. Wire sample (the exec happens after C's LOGIN; the
tagged OK is imapd's own, it reads ``IMAPLOGINTAG``)::

    S: * OK [CAPABILITY IMAP4rev1 UIDPLUS ... IDLE] Courier-IMAP ready (mailtap dev login).
    C: a1 LOGIN alice@example.com "secret"
    S: a1 OK LOGIN Ok.

Each connection is a forked child of this process (forked by the main thread, so the
``PR_SET_PDEATHSIG`` it sets ties imapd to this process's life); a child reads the LOGIN line
byte by byte, so nothing the client sends after it is swallowed before imapd reads it.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import signal
import socket
import socketserver
import sys
from pathlib import Path
from typing import Any

from mailtap.dev import dovecot

PR_SET_PDEATHSIG = 1
#: Longest command line before LOGIN we accept (a LOGIN with long quoted strings fits).
MAX_LINE = 8192


class _Closed(Exception):
    """The client went away before logging in."""


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def byte(self) -> bytes:
        got = self.sock.recv(1)
        if not got:
            raise _Closed
        return got

    def line(self) -> bytes:
        out = bytearray()
        while not out.endswith(b"\r\n"):
            out += self.byte()
            if len(out) > MAX_LINE:
                raise _Closed
        return bytes(out[:-2])

    def exactly(self, count: int) -> bytes:
        out = bytearray()
        while len(out) < count:
            chunk = self.sock.recv(count - len(out))
            if not chunk:
                raise _Closed
            out += chunk
        return bytes(out)


def _arguments(rest: bytes, reader: _Reader, sock: socket.socket) -> list[bytes]:
    """RFC 3501 arguments: atoms, quoted strings (``"se\\"cret"``) and literals (``{6}`` at the
    end of the line, a ``+`` continuation, then the bytes and the rest of the line)."""
    args: list[bytes] = []
    i = 0
    while i < len(rest):
        if rest[i : i + 1] == b" ":
            i += 1
        elif rest[i : i + 1] == b'"':
            value = bytearray()
            i += 1
            while i < len(rest) and rest[i : i + 1] != b'"':
                if rest[i : i + 1] == b"\\":
                    i += 1
                value += rest[i : i + 1]
                i += 1
            args.append(bytes(value))
            i += 1
        elif rest[i : i + 1] == b"{" and rest.endswith(b"}"):
            size = rest[i + 1 : -1].rstrip(b"+")
            if not size.isdigit():
                raise ValueError("bad literal")
            if not rest.endswith(b"+}"):
                sock.sendall(b"+ OK\r\n")
            args.append(reader.exactly(int(size)))
            rest, i = reader.line(), 0
        else:
            end = rest.find(b" ", i)
            end = len(rest) if end < 0 else end
            args.append(rest[i:end])
            i = end
    return args


class CourierLogin(socketserver.BaseRequestHandler):
    server: LoginServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        settings = self.server.settings
        capability = settings["imapd_settings"]["IMAP_CAPABILITY"]
        reader = _Reader(sock)
        sock.sendall(
            f"* OK [CAPABILITY {capability}] Courier-IMAP ready (mailtap dev login).\r\n".encode()
        )
        try:
            while True:
                tag, _, rest = reader.line().partition(b" ")
                command, _, rest = rest.partition(b" ")
                verb = command.upper()
                if verb == b"CAPABILITY":
                    sock.sendall(b"* CAPABILITY " + capability.encode() + b"\r\n")
                    sock.sendall(tag + b" OK CAPABILITY completed\r\n")
                elif verb == b"NOOP":
                    sock.sendall(tag + b" OK NOOP completed\r\n")
                elif verb == b"LOGOUT":
                    sock.sendall(b"* BYE Courier-IMAP server shutting down\r\n")
                    sock.sendall(tag + b" OK LOGOUT completed\r\n")
                    return
                elif verb == b"LOGIN":
                    args = _arguments(rest, reader, sock)
                    if len(args) == 2 and self._accepted(args[0], args[1]):
                        self._exec_imapd(sock, tag.decode(), args[0].decode())
                    sock.sendall(tag + b" NO [AUTHENTICATIONFAILED] Login failed.\r\n")
                else:
                    sock.sendall(
                        tag + b" BAD Only CAPABILITY, NOOP, LOGIN, LOGOUT before login\r\n"
                    )
        except (_Closed, ValueError, OSError):
            return

    def _accepted(self, username: bytes, password: bytes) -> bool:
        accounts = dict(dovecot.users(Path(self.server.settings["accounts_file"])))
        try:
            return accounts.get(username.decode()) == password.decode()
        except UnicodeDecodeError:
            return False

    def _exec_imapd(self, sock: socket.socket, tag: str, username: str) -> None:
        settings = self.server.settings
        home = Path(settings["mail_dir"]) / username
        peer, local = sock.getpeername(), sock.getsockname()
        env = {
            "PATH": "/usr/bin:/bin",
            "AUTHENTICATED": username,
            "IMAPLOGINTAG": tag,
            "HOME": home.as_posix(),
            "TCPREMOTEIP": peer[0],
            "TCPREMOTEPORT": str(peer[1]),
            "TCPLOCALIP": local[0],
            "TCPLOCALPORT": str(local[1]),
            **settings["imapd_settings"],
        }
        os.dup2(sock.fileno(), 0)
        os.dup2(sock.fileno(), 1)
        os.chdir(home)
        if os.geteuid() == 0:
            user = pwd.getpwnam(settings["mail_user"])
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        # After the setuid, which clears it (prctl(2)): imapd ends with this front end.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.execve(settings["imapd"], [settings["imapd"], "Maildir"], env)


class LoginServer(socketserver.ForkingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    #: Tests open many connections at once (Dovecot's instance allows 200 per user and IP).
    max_children = 400
    block_on_close = False

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        super().__init__((settings["host"], int(settings["port"])), CourierLogin)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    settings = json.loads(Path(args[0]).read_text())
    with LoginServer(settings) as server:
        print(f"courier login front end on {settings['host']}:{settings['port']}", flush=True)
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
