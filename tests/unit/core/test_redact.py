"""Credentials that libraries put into log lines are redacted before any handler sees them."""

from __future__ import annotations

import logging

import pytest

from connectors.core.redact import REDACTED, quiet_token_libraries, redact_headers


def test_authorization_and_cookie_values_are_redacted_in_dicts_and_dumps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    redact_headers("lib.http")
    redact_headers("lib.http")  # idempotent
    log = logging.getLogger("lib.http")
    headers = {"User-Agent": "x", "Authorization": "Basic dXNlcjpwYXNz", "Cookie": "s=1; t=2"}
    log.debug("Request headers: %(request_headers)s", {"request_headers": headers})
    log.error("%s\n%s", "failed", "proxy-authorization: NTLM TlRMTVNTUAAD\nAccept: */*")
    text = caplog.text
    assert "dXNlcjpwYXNz" not in text and "s=1" not in text and "TlRMTVNTUAAD" not in text
    assert text.count(REDACTED) == 3 and "'User-Agent': 'x'" in text and "Accept: */*" in text
    assert len(logging.getLogger("lib.http").filters) == 1


def test_token_libraries_stay_quiet_below_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    quiet_token_libraries()
    logging.getLogger("requests_oauthlib.oauth2_session").debug("content {'access_token': 'x'}")
    logging.getLogger("oauthlib.oauth2").info("kept")
    assert "access_token" not in caplog.text and "kept" in caplog.text
