"""NTLM (MS-NLMP) over HTTP the way IIS does it in front of Exchange: per connection.

    C: POST                                   S: 401  WWW-Authenticate: NTLM, Negotiate, Basic
    C: POST  Authorization: NTLM <NEGOTIATE>  S: 401  WWW-Authenticate: NTLM <CHALLENGE>
    C: POST  Authorization: NTLM <AUTHENTICATE>
                                              S: 200  (and the connection stays authenticated:
                                                       later requests on it carry no header)

The acceptor is pyspnego's NTLM implementation (a dependency of requests_ntlm, which exchangelib
uses as the client). pyspnego reads the accepted users from the file named by the environment
variable ``NTLM_USER_FILE`` (lines ``DOMAIN:user:password``); :func:`write_user_file` writes it.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import spnego

NTLM_DOMAIN = "EXAMPLE"
_NEGOTIATE = b"NTLMSSP\x00\x01\x00\x00\x00"


class NtlmFailed(Exception):
    """The AUTHENTICATE message did not prove the password (or came without a NEGOTIATE)."""


def write_user_file(path: Path, mailboxes: Iterable[tuple[str, str]]) -> None:
    """One line per way exchangelib names a user: ``\\user@example.com`` and ``EXAMPLE\\user``."""
    lines = []
    for address, password in mailboxes:
        lines.append(f":{address}:{password}")
        lines.append(f"{NTLM_DOMAIN}:{address.split('@')[0]}:{password}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class NtlmAcceptor:
    """The server side of one connection's handshake."""

    def __init__(self, user_file: Path) -> None:
        if os.environ.get("NTLM_USER_FILE") != str(user_file):
            raise RuntimeError(f"NTLM needs the environment variable NTLM_USER_FILE={user_file}")
        self._context: Any = None

    def step(self, header_value: str) -> tuple[str | None, str | None]:
        """``(challenge header, None)`` after a NEGOTIATE; ``(None, principal)`` when done."""
        token = base64.b64decode(header_value.split(" ", 1)[1])
        if token.startswith(_NEGOTIATE):
            self._context = spnego.server(protocol="ntlm")
            challenge = self._context.step(token)
            return f"NTLM {base64.b64encode(challenge).decode()}", None
        if self._context is None:
            raise NtlmFailed("AUTHENTICATE without NEGOTIATE on this connection")
        try:
            self._context.step(token)
        except spnego.exceptions.SpnegoError as exc:
            raise NtlmFailed(str(exc)) from exc
        principal = str(self._context.client_principal)
        self._context = None
        return None, principal
