"""The Graph test server as tests use it: one mailbox, one app (secret), ready to call.

from tests.graph_server.fixture import graph_server  # in a conftest.py: the fixture

def test_x(graph_server: GraphTestServer) -> None:
    graph_server.add_message(USER, mime)
    token = app_token(graph_server)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest
import requests

from .server import GraphTestServer


class GraphEndpoint(Protocol):
    """What a client needs of a server, in this process (``GraphTestServer``) or another
    (``remote.RemoteGraphServer``)."""

    @property
    def authority(self) -> str: ...

    @property
    def graph_url(self) -> str: ...

    @property
    def ca_file(self) -> Path: ...


USER = "user@example.com"
CLIENT_ID = "11111111-2222-3333-4444-555555555555"
CLIENT_SECRET = "graph-s3cret"
GRAPH_SCOPE = ["https://graph.microsoft.com/.default"]


@contextmanager
def running_server(**options: Any) -> Iterator[GraphTestServer]:
    """A started server with mailbox ``USER`` and app ``CLIENT_ID`` / ``CLIENT_SECRET``."""
    with GraphTestServer(**options) as server:
        server.add_mailbox(USER)
        server.register_app(CLIENT_ID, secret=CLIENT_SECRET)
        yield server


@pytest.fixture
def graph_server() -> Iterator[GraphTestServer]:
    """A fresh server per test (start-up is ~50 ms: a CA, a certificate, one socket)."""
    with running_server() as server:
        yield server


def trusting_session(server: GraphEndpoint) -> requests.Session:
    """A requests session that trusts the server's CA.

    ``trust_env=False`` because requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` win over
    ``Session.verify`` (psf/requests#3829), and MSAL's ``verify=`` only sets ``Session.verify``:
    on a machine with those variables set, MSAL would not trust the server. Give MSAL this
    session as ``http_client`` instead."""
    session = requests.Session()
    session.trust_env = False
    session.verify = str(server.ca_file)
    return session


def app_token(server: GraphEndpoint) -> str:
    """An app-only access token for ``CLIENT_ID``, through MSAL as the connector gets one."""
    import msal

    app = msal.ConfidentialClientApplication(
        CLIENT_ID,
        client_credential=CLIENT_SECRET,
        authority=server.authority,
        instance_discovery=False,
        http_client=trusting_session(server),
    )
    result = app.acquire_token_for_client(scopes=GRAPH_SCOPE)
    if "access_token" not in result:
        raise AssertionError(f"no token from the Graph test server: {result}")
    return str(result["access_token"])
