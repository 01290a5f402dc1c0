"""The Graph test server in its own process, driven through the control endpoint."""

from __future__ import annotations

import requests

from tests.graph_server.bench import raw_delta_paging
from tests.graph_server.fixture import app_token, trusting_session
from tests.graph_server.remote import spawn


def test_spawned_server_serves_graph_and_obeys_the_control_endpoint() -> None:
    with spawn() as graph:
        graph.call("seed", user=graph.user, count=12, size=500)
        mime = f"From: a@example.org\r\nTo: {graph.user}\r\nSubject: remote\r\nMessage-ID: <r1@x>\r\n\r\nx\r\n"
        added = graph.add_message(graph.user, mime.encode())
        token = app_token(graph)
        figures = raw_delta_paging(graph, token, graph.user, page_size=5, mime=True)
        assert (figures.messages, figures.pages) == (13, 3)
        graph.update_message(graph.user, added["immutable_id"], is_read=True)
        (listed,) = [
            m
            for m in graph.call("messages", address=graph.user)
            if m["immutable_id"] == added["immutable_id"]
        ]
        assert listed["is_read"] is True
        graph.call("fail_requests", count=1, status=503, retry_after=3)
        session = trusting_session(graph)
        failed = session.get(
            f"{graph.graph_url}/users/{graph.user}/mailFolders",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert failed.status_code == 503
        assert failed.headers["Retry-After"] == "3"
        unknown = session.post(f"{graph.url}/_control/stop")
        assert unknown.status_code == 404
        url = graph.url
    # The process is gone with the context.
    try:
        requests.get(url, timeout=2, verify=False)
        reachable = True
    except requests.ConnectionError:
        reachable = False
    assert not reachable
