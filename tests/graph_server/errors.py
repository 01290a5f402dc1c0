"""The error answer of the Graph test server's handlers, rendered as Graph's error body
(https://learn.microsoft.com/en-us/graph/errors) by ``server.py``."""

from __future__ import annotations


class GraphError(Exception):
    """An error answer: status, Graph error code, message, extra headers."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
