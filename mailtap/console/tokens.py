"""Bearer tokens and their roles, read from a file (a Kubernetes Secret mounted as a file).

The file is a YAML list; each entry names a person or a system, its role and its token::

    - {name: alice, role: operator, token: "k3J9…"}     # may act: replay, drop, add, pause…
    - {name: grafana, role: viewer, token: "Qm2x…"}     # may only read (GET)

A token is looked up in constant time per entry (:func:`hmac.compare_digest`), so the time of a
wrong guess says nothing about the right one. The file is re-read when its modification time
changes: a rotated Secret takes effect without a restart. Tokens are never logged or shown;
the audit trail names the entry's ``name``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from connectors.core.errors import ConfigError

log = logging.getLogger(__name__)

Role = Literal["viewer", "operator"]
ROLES: tuple[Role, ...] = ("viewer", "operator")
#: A shorter token can be guessed; ``openssl rand -base64 32`` gives 44 characters.
MIN_TOKEN_LENGTH = 24


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token belongs to."""

    name: str
    role: Role

    @property
    def may_act(self) -> bool:
        return self.role == "operator"


def parse_tokens(text: str, where: str) -> list[tuple[bytes, Principal]]:
    """The entries of a tokens file; :class:`ConfigError` naming what to change.

    >>> [p for _, p in parse_tokens("- {name: a, role: viewer, token: %s}" % ("x" * 24), "f")]
    [Principal(name='a', role='viewer')]
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(document, list) or not document:
        raise ConfigError(
            f"{where}: expected a list of {{name, role: viewer|operator, token}} entries"
        )
    entries: list[tuple[bytes, Principal]] = []
    names: set[str] = set()
    for number, entry in enumerate(document, 1):
        if not isinstance(entry, dict) or set(entry) != {"name", "role", "token"}:
            raise ConfigError(f"{where}: entry {number} must have exactly name, role and token")
        name, role, token = str(entry["name"]), entry["role"], str(entry["token"])
        if role not in ROLES:
            raise ConfigError(
                f"{where}: entry {number} ({name}): role must be viewer or operator, not {role!r}"
            )
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(
                f"{where}: entry {number} ({name}): the token is shorter than "
                f"{MIN_TOKEN_LENGTH} characters; make one with `openssl rand -base64 32`"
            )
        if name in names:
            raise ConfigError(f"{where}: the name {name!r} is given twice")
        names.add(name)
        entries.append((token.encode(), Principal(name, role)))
    return entries


class TokenBook:
    """The tokens of ``path``, re-read when the file changes."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: list[tuple[bytes, Principal]] = []
        self._reload()  # a missing or bad file fails the start

    def _reload(self) -> None:
        try:
            stat = self._path.stat()
            text = self._path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"console.tokens_file {self._path} cannot be read ({exc.strerror}); "
                f"point it at a YAML list of {{name, role, token}}"
            ) from None
        self._entries = parse_tokens(text, f"console.tokens_file {self._path}")
        self._stamp = (stat.st_mtime_ns, stat.st_size)

    def _fresh(self) -> None:
        try:
            stat = self._path.stat()
        except OSError:
            return  # mid-rotation (a Secret's symlink swap): keep the last good tokens
        if (stat.st_mtime_ns, stat.st_size) != self._stamp:
            try:
                self._reload()
                log.info("console tokens re-read", extra={"entries": len(self._entries)})
            except ConfigError as exc:
                log.error("console tokens file unusable, keeping the previous: %s", exc)

    def lookup(self, token: str | None) -> Principal | None:
        """The principal of ``token``; None for an unknown or missing one."""
        if not token:
            return None
        with self._lock:
            self._fresh()
            entries = list(self._entries)
        offered = token.encode()
        found = None
        for known, principal in entries:  # no early exit: every entry is compared
            if hmac.compare_digest(known, offered):
                found = principal
        return found


def csrf_token(session_token: str) -> str:
    """The CSRF token of a login: derived from its (HttpOnly) session token, so no state is
    kept and every replica agrees, while a page of another site can neither read nor compute
    it."""
    return hmac.new(session_token.encode(), b"mailtap-console-csrf", hashlib.sha256).hexdigest()
