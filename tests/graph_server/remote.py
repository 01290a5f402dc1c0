"""The Graph test server in its own process, driven through its control endpoint.

For benchmarks and tests where the server must not share the measured process's GIL::

    with spawn() as graph:                       # python -m tests.graph_server, tied to us
        graph.call("seed", user=graph.user, count=2000)
        message = graph.add_message(graph.user, mime)       # {"immutable_id": ..., ...}
        figures = raw_delta_paging(graph, token, graph.user) # bench.py takes it as well

The child gets SIGKILL when the thread that spawned it ends (``die_with_parent``) and exits
when its stdin closes, so a killed test leaves no server behind.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.process import die_with_parent, terminate


class RemoteGraphServer:
    """The subset of ``GraphTestServer`` a remote caller needs, plus ``call`` for the rest."""

    def __init__(self, info: dict[str, str]) -> None:
        self.url = info["url"]
        self.authority = info["authority"]
        self.graph_url = info["graph_url"]
        self.ca_file = Path(info["ca_file"])
        self.tenant = info["tenant"]
        self.user = info["user"]
        self.client_id = info["client_id"]
        self.client_secret = info["client_secret"]
        self._control = info["control_url"]
        self._session = requests.Session()
        self._session.trust_env = (
            False  # REQUESTS_CA_BUNDLE would override verify (psf/requests#3829)
        )
        self._session.verify = str(self.ca_file)

    def call(self, operation: str, **kwargs: Any) -> Any:
        """``GraphTestServer.<operation>(**kwargs)`` in the server process; its JSON result."""
        if isinstance(kwargs.get("mime"), bytes):
            kwargs["mime_base64"] = base64.b64encode(kwargs.pop("mime")).decode()
        response = self._session.post(f"{self._control}/{operation}", json=kwargs, timeout=60)
        body = response.json()
        if response.status_code != 200:
            raise RuntimeError(f"graph test server: {operation}: {body.get('error')}")
        return body["result"]

    def add_message(self, address: str, mime: bytes, **kwargs: Any) -> dict[str, Any]:
        return dict(self.call("add_message", address=address, mime=mime, **kwargs))

    def update_message(self, address: str, message_id: str, **kwargs: Any) -> dict[str, Any]:
        return dict(self.call("update_message", address=address, message_id=message_id, **kwargs))

    def move_message(self, address: str, message_id: str, folder: str) -> dict[str, Any]:
        return dict(
            self.call("move_message", address=address, message_id=message_id, folder=folder)
        )

    def delete_message(self, address: str, message_id: str) -> None:
        self.call("delete_message", address=address, message_id=message_id)


@contextmanager
def spawn(*options: str) -> Iterator[RemoteGraphServer]:
    """Start ``python -m tests.graph_server *options``; stop it (SIGTERM) at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.graph_server", *options],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the Graph test server process ended at start (exit {proc.wait(10)})"
            )
        yield RemoteGraphServer(json.loads(line))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        terminate(proc, grace=10)
