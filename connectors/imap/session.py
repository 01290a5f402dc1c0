"""Opening an IMAP session: TCP, TLS (``ssl``, or STARTTLS that must succeed), and the login
(password, XOAUTH2 with a token, a token file, or a client-credentials grant).

Security rules (DESIGN.md) enforced here: certificates verified and host names checked; a server
that does not offer STARTTLS is a configuration error, never a silent plaintext session; a
refused login is an ``AuthenticationError`` (permanent: retrying would lock the account), and
the secret never appears in it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import ssl
from pathlib import Path

from imapclient import IMAPClient, SocketTimeout
from imapclient import exceptions as imap_exc

from connectors.imap.config import ImapAccountSettings
from connectors.imap.errors import AuthenticationError, ConfigError
from connectors.imap.wire import wire

__all__ = ["log_in", "open_client", "tls_context"]


def tls_context(a: ImapAccountSettings, given: ssl.SSLContext | None) -> ssl.SSLContext:
    """``given``, or the context every connection with the same ``ca_file`` shares.

    Shared, not one per connection: a context holds its CA store (~0.9 MB with the system's)
    and building it costs milliseconds of CPU, which a reconnect of every mailbox at once (the
    server restarted) paid per mailbox. A ``ca_file`` rewritten since (a rotated CA) gets a new
    context at the next connection.
    """
    if given is not None:
        return given
    return _shared_context(a.ca_file, _file_version(a.ca_file))


def _file_version(path: str | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None  # create_default_context says what is wrong with it
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=32)
def _shared_context(ca_file: str | None, _version: tuple[int, int] | None) -> ssl.SSLContext:
    # Verification on, hostname checked: create_default_context() does both.
    return ssl.create_default_context(cafile=ca_file)


def open_client(
    a: ImapAccountSettings,
    *,
    connect_timeout: float,
    read_timeout: float,
    ssl_context: ssl.SSLContext | None,
) -> IMAPClient:
    """A connected client, TLS verified (``ssl``, or ``starttls`` that must succeed)."""
    timeout = SocketTimeout(connect=connect_timeout, read=read_timeout)
    with wire("connect"):
        client = IMAPClient(
            a.host,
            port=a.effective_port,
            ssl=a.security == "ssl",
            ssl_context=tls_context(a, ssl_context) if a.security == "ssl" else None,
            timeout=timeout,
        )
    # tz-aware INTERNALDATE instead of naive local time.
    client.normalise_times = False
    if not logging.getLogger("imapclient.imaplib").isEnabledFor(logging.DEBUG):
        # imapclient sets imaplib's debug level to 5 to route it into logging, so imaplib
        # formats a repr of every response line (a whole mail) and of every FETCH result,
        # even when nobody logs it: ~30% of the FETCH time. Off unless that logger is on.
        client._imap.debug = 0
    if a.security == "starttls":
        try:
            with wire("capability"):
                caps = client.capabilities()
            if b"STARTTLS" not in caps:
                # Never fall back to plaintext (DESIGN.md, security rules).
                raise ConfigError(
                    f"imap account {a.name}: {a.host} does not offer STARTTLS; "
                    f"use security: ssl or fix the server"
                )
            with wire("starttls"):
                client.starttls(tls_context(a, ssl_context))
        except BaseException:
            # Nobody else holds the client yet: drop it without a round trip.
            with contextlib.suppress(Exception):
                client.shutdown()
            raise
    return client


def log_in(client: IMAPClient, a: ImapAccountSettings) -> frozenset[bytes]:
    """LOGIN or AUTHENTICATE XOAUTH2; returns the capabilities announced after it (Dovecot
    announces CONDSTORE and QRESYNC only then)."""
    fetched: str | None = None
    with wire("login"):
        try:
            if a.oauth2 is not None:
                # Imported here: requests/oauthlib cost ~0.1 s of every start, and only
                # accounts with a client-credentials grant use them.
                from connectors.core.oauth2 import client_credentials

                fetched = client_credentials(a.oauth2).token()
                client.oauth2_login(a.username, fetched)
            elif a.oauth2_access_token_file is not None:
                client.oauth2_login(a.username, read_token(a.oauth2_access_token_file))
            elif a.oauth2_access_token is not None:
                client.oauth2_login(a.username, a.oauth2_access_token.get_secret_value())
            elif a.password is not None:
                client.login(a.username, a.password.get_secret_value())
        except imap_exc.IMAPClientAbortError:
            raise
        except imap_exc.IMAPClientError as exc:
            # A NO to LOGIN/AUTHENTICATE: the credentials are wrong or the account locked.
            if fetched is not None and a.oauth2 is not None:
                client_credentials(a.oauth2).refused(fetched)  # revoked: fetch anew next time
            raise AuthenticationError(f"login as {a.username} refused: {exc}") from exc
        return frozenset(client.capabilities())


def read_token(path: Path) -> str:
    """The bearer token in ``path`` as it is now (a refresher may have rewritten it)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise AuthenticationError(f"cannot read oauth2_access_token_file {path}: {exc}") from exc
    if not token:
        raise AuthenticationError(f"oauth2_access_token_file {path} is empty")
    return token
