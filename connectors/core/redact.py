"""Keep credentials out of the log lines of the libraries we drive.

Our own code never passes a secret to a log call (settings hold them as ``SecretStr``). Some
libraries do, at DEBUG (``mailtap -vv``) or when a request fails:

- exchangelib (``exchangelib.util``) logs each request's headers at DEBUG: the
  ``Authorization`` header carries the basic-auth password, an OAuth token or the NTLM
  response. It also dumps the exchange at ERROR when a request fails. :func:`redact_headers`
  formats such records and replaces credential header values.
- requests-oauthlib logs a token endpoint's whole answer (the access token in it), and oauthlib
  the request body: :func:`quiet_token_libraries` keeps both at INFO whatever the root level.
"""

from __future__ import annotations

import logging
import re

__all__ = ["quiet_token_libraries", "redact_headers"]

#: The value of a credential-bearing HTTP header in a formatted dict or a header dump.
_CREDENTIAL_HEADER = re.compile(
    r"""((?:proxy-)?authorization|cookie|set-cookie)(['"]?\s*:\s*['"]?)[^'",}\r\n]*""",
    re.IGNORECASE,
)
REDACTED = "**REDACTED**"


class RedactCredentials(logging.Filter):
    """Replace the values of Authorization/Cookie headers in a record's message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _CREDENTIAL_HEADER.sub(rf"\1\2{REDACTED}", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redact_headers(logger_name: str) -> None:
    """Redact credential headers in what ``logger_name`` itself logs (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactCredentials) for f in logger.filters):
        logger.addFilter(RedactCredentials())


def quiet_token_libraries() -> None:
    for name in ("requests_oauthlib", "oauthlib"):
        logging.getLogger(name).setLevel(logging.INFO)
