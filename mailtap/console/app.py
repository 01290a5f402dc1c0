"""The ASGI application: the API, the pages, the static files, and the rules every request
meets — a body size limit, errors as Kafka Connect's ``{"error_code", "message"}`` JSON, no
traceback and no secret in any answer.

Framework: FastAPI on Starlette (routing, request validation with the pydantic models mailtap
already uses, the OpenAPI document at ``/api/v1/openapi.json``), Jinja2 for the pages, uvicorn
as the server.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connectors.core.errors import ConfigError
from mailtap.commands.errors import (
    ActionError,
    InvalidInput,
    NotAcknowledged,
    NotApplicable,
    UnknownTarget,
)
from mailtap.console import api, pages
from mailtap.console.actions import Console
from mailtap.console.errors import Forbidden, Unauthorized

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class MailtapJSON(JSONResponse):
    """JSON with datetimes as ISO text and bytes as text (decoded records hold both)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=_default, ensure_ascii=False).encode("utf-8")


def error(status: int, message: str) -> MailtapJSON:
    return MailtapJSON({"error_code": status, "message": message}, status_code=status)


#: An action's error -> the HTTP status it is answered with.
STATUS_OF: list[tuple[type[Exception], int]] = [
    (Unauthorized, 401),
    (Forbidden, 403),
    (UnknownTarget, 404),
    (InvalidInput, 400),
    (NotApplicable, 409),
    (NotAcknowledged, 503),
    (ActionError, 400),
    (ConfigError, 400),  # e.g. a folder that is its account's move target
]


class BodyLimit:
    """Refuses a body over ``limit`` bytes with 413 before the app reads any of it (declared
    length) or as soon as it passes the limit (chunked)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await self._refuse(scope, receive, send)
                return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                # After the body, wait for the real disconnect: a streaming response (the
                # static files) listens for it and would stop half-way on a made-up one.
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error(413, f"the request body is larger than {self.limit} bytes")
        await response(scope, receive, send)


def build_app(console: Console) -> ASGIApp:
    app = FastAPI(
        title="mailtap console",
        version="1",
        description="The REST admin API of mailtap (docs/console.md). Bearer tokens; viewer "
        "may GET, operator may also act. Errors: {error_code, message}.",
        openapi_url=f"{api.API_PREFIX}/openapi.json",
        docs_url=None,  # Swagger UI loads from a CDN: not in an offline image
        redoc_url=None,
        default_response_class=MailtapJSON,
    )
    app.state.console = console
    app.include_router(api.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    for exc_type, status in STATUS_OF:
        app.add_exception_handler(exc_type, _handler(status))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> MailtapJSON:
        return error(400, _describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> MailtapJSON:
        return error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> MailtapJSON:
        log.error("console: %s %s failed", request.method, request.url.path, exc_info=exc)
        return error(500, f"internal error ({type(exc).__name__}); the console log has details")

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> MailtapJSON:
        """Liveness and readiness: the console answers and has read the topics once."""
        snap = console.cache.current
        if snap is None:
            return MailtapJSON({"ok": False, "reason": "the topics were not read yet"}, 503)
        age = (dt.datetime.now(dt.UTC) - snap.taken_at).total_seconds()
        return MailtapJSON({"ok": True, "snapshot_age_seconds": round(age, 1)})

    return BodyLimit(app, console.settings.max_body_bytes)


def _handler(status: int) -> Any:
    async def handle(request: Request, exc: Exception) -> Any:
        if request.url.path.startswith(api.API_PREFIX) or request.headers.get(
            "accept", ""
        ).startswith("application/json"):
            return error(status, str(exc))
        return pages.error_page(request, status, str(exc))

    return handle


def _describe(exc: RequestValidationError) -> str:
    """One sentence per problem: ``body.address: field required``."""
    parts = []
    for problem in exc.errors():
        where = ".".join(str(p) for p in problem.get("loc", ()))
        message = problem.get("msg", "invalid")
        if problem.get("type") == "json_invalid":
            message = "the body is not valid JSON"
        parts.append(f"{where}: {message}")
    return "; ".join(parts) or "invalid request"
