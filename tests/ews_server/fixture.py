"""The server as the EWS tests use it: a fast clock and one mailbox."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .server import EwsTestServer

USER = "user@example.com"
PASSWORD = "s3cret"


@contextmanager
def fast_server(**options: Any) -> Iterator[EwsTestServer]:
    """ConnectionTimeout "minutes" last one second; keep-alives every 0.2 s (unless overridden)."""
    options = {"seconds_per_minute": 1.0, "keepalive_seconds": 0.2, **options}
    with EwsTestServer(**options) as server:
        server.add_mailbox(USER, PASSWORD)
        yield server
