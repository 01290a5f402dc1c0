"""The test-side API of the Graph test server over HTTP, for a server in another process.

``POST /_control/{operation}`` with a JSON object of keyword arguments calls the
``GraphTestServer`` method of that name and answers ``{"result": ...}`` (a message as its ids).
Not a Graph endpoint: it exists only in the test server, takes no token (loopback only), and
lets a benchmark or a test run the server in its own process (``remote.py``), so that the
server does not share a GIL with the component being measured.

MIME travels base64-encoded (``mime_base64``); datetimes as ISO 8601 (``received``).
"""

from __future__ import annotations

import base64
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .auth import Principal
from .mailbox import GraphStoreError, Mailbox, MailFolder, Message

if TYPE_CHECKING:
    from .server import GraphTestServer

#: The operations a remote test may call; everything else is refused.
OPERATIONS = frozenset(
    {
        "add_mailbox",
        "add_folder",
        "folder_id",
        "register_app",
        "issue_refresh_token",
        "add_message",
        "update_message",
        "move_message",
        "delete_message",
        "messages",
        "seed",
        "delete_mailbox",
        "revoke_access",
        "expire_access_tokens",
        "revoke_refresh_tokens",
        "expire_delta_tokens",
        "replay_changes",
        "fail_requests",
        "clear_failures",
        "slow_responses",
        "drop_notifications",
        "send_lifecycle_event",
        "expire_subscription",
        "bounce_recipient",
        "subscriptions",
        "sent",
        "deliveries",
    }
)


class ControlApi:
    """A ``ServerExtension`` that adds ``/_control/{operation}``."""

    def __init__(self, server: GraphTestServer) -> None:
        self.server = server

    def install(self, app: web.Application) -> None:
        app.router.add_post("/_control/{operation}", self._call)

    async def close(self) -> None:
        return None

    async def dispatch(
        self,
        request: web.Request,
        path: str,
        mailbox: Mailbox | None,
        rest: list[str],
        principal: Principal,
    ) -> web.StreamResponse | None:
        return None

    async def _call(self, request: web.Request) -> web.Response:
        operation = request.match_info["operation"]
        if operation not in OPERATIONS:
            return web.json_response({"error": f"unknown operation {operation!r}"}, status=404)
        try:
            kwargs = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        if not isinstance(kwargs, dict):
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        if "mime_base64" in kwargs:
            kwargs["mime"] = base64.b64decode(kwargs.pop("mime_base64"))
        if isinstance(kwargs.get("received"), str):
            kwargs["received"] = datetime.fromisoformat(kwargs["received"])
        if operation == "seed":
            from .bench import seed

            call: Any = lambda **kw: seed(self.server, **kw)  # noqa: E731
        else:
            call = getattr(self.server, operation)
        try:
            result = call(**kwargs) if callable(call) else call
        except (GraphStoreError, KeyError, ValueError, TypeError) as e:
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=400)
        return web.json_response({"result": _plain(result)})


def _plain(value: Any) -> Any:
    """JSON-able form of what a server method returns."""
    if isinstance(value, Message):
        return {
            "immutable_id": value.immutable_id,
            "rest_id": value.rest_id,
            "folder_id": value.folder_id,
            "internet_message_id": value.internet_message_id,
            "subject": value.subject,
            "is_read": value.is_read,
        }
    if isinstance(value, MailFolder):
        return {"folder_id": value.folder_id, "display_name": value.display_name}
    if isinstance(value, Mailbox):
        return {"address": value.address, "user_id": value.user_id}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
