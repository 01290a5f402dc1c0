"""imapclient's, imaplib's and the socket's errors, as ours: the one translation of the wire.

Every call into imapclient runs inside ``with wire("operation"):`` (:mod:`connectors.imap.connection`
and its parts :mod:`~connectors.imap.session`, :mod:`~connectors.imap.idle`), so the rest of the
connector sees three kinds of failure, with the library's error as the cause:
:class:`~connectors.imap.errors.ConnectionLost` (retry), ``AuthenticationError`` (permanent, back
off to the cap) and :class:`~connectors.imap.errors.ImapProtocolError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from imapclient import exceptions as imap_exc

from connectors.imap.errors import AuthenticationError, ConnectionLost, ImapProtocolError

__all__ = ["text", "wire"]


@contextlib.contextmanager
def wire(operation: str) -> Iterator[None]:
    """Translate imapclient/imaplib/socket errors into ours, keeping the cause chain."""
    try:
        yield
    except imap_exc.LoginError as exc:
        raise AuthenticationError(f"{operation}: login refused: {exc}") from exc
    except imap_exc.IMAPClientAbortError as exc:
        raise ConnectionLost(f"{operation}: connection aborted: {exc}") from exc
    except (OSError, EOFError) as exc:  # socket.timeout, ssl.SSLError, resets, broken pipes
        raise ConnectionLost(f"{operation}: {type(exc).__name__}: {exc}") from exc
    except imap_exc.IMAPClientError as exc:
        raise ImapProtocolError(f"{operation}: {exc}") from exc


def text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
