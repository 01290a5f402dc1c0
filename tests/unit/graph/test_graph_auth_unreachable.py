"""An authority that cannot be reached at start (no network yet, DNS) is retried, not a crash.

Found by running the image's graph-source where login.microsoftonline.com does not resolve:
MSAL fetches the authority's metadata when the application is made, and the source exited with
a traceback. Now the first token retries it and reports ``ConnectionLost`` (the worker's backoff).
"""

from __future__ import annotations

import socket

import pytest

from connectors.graph.auth import TokenSource
from connectors.graph.config import GraphSourceSettings
from connectors.graph.errors import ConnectionLost


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_authority_is_a_retriable_error_at_the_first_token() -> None:
    settings = GraphSourceSettings.model_validate(
        {
            "tenant_id": "contoso",
            "client_id": "c",
            "client_secret": "not-shown",
            "authority_host": f"https://127.0.0.1:{closed_port()}",
            "accounts": [{"name": "support", "user": "support@contoso.com"}],
        }
    )
    tokens = TokenSource(settings)  # no exception: the start goes on
    with pytest.raises(ConnectionLost, match="token endpoint unreachable") as caught:
        tokens.token()
    assert "not-shown" not in str(caught.value)
    tokens.refused()  # nothing cached yet: a no-op, not an error
