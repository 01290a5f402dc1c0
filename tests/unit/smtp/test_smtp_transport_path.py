"""smtp_path: the MAIL/RCPT path of a plain address without aiosmtplib's parsing, byte for byte
what aiosmtplib's quote_address makes of it; every other address is left to aiosmtplib."""

from __future__ import annotations

import pytest
from aiosmtplib.email import quote_address

from connectors.smtp.transport import smtp_path

PLAIN = [
    "rcpt1@example.org",
    "bounce+bench-x-000001@example.com",
    "first.last@sub.example.co.uk",
    "o'brien@example.ie",
    "a!#$%&*+/=?^_`{|}~-z@xn--bcher-kva.example",
    "x@localhost",
]
NOT_PLAIN = [
    "Ann <ann@example.com>",  # a display name: parseaddr strips it
    '"quoted local"@example.com',
    "a..b@example.com",  # not a dot-atom
    ".a@example.com",
    "a.@example.com",
    "用户@例子.广告",  # SMTPUTF8: encoded as UTF-8 by aiosmtplib
    "a@example.com\r\nRCPT TO:<b@example.com>",  # injection: aiosmtplib refuses it
    "a b@example.com",
    "a@[127.0.0.1]",
    "no-at-sign",
    "",
]


@pytest.mark.parametrize("address", PLAIN)
def test_a_plain_address_is_quoted_as_aiosmtplib_quotes_it(address: str) -> None:
    assert smtp_path(address) == quote_address(address).encode("ascii")


@pytest.mark.parametrize("address", NOT_PLAIN)
def test_any_other_address_is_left_to_aiosmtplib(address: str) -> None:
    assert smtp_path(address) is None
