"""The web page: server-rendered HTML (Jinja2) over the same :class:`.actions.Console` as the
API, usable without JavaScript; ``static/console.js`` only turns the forms into in-place
updates.

Login: the token is posted once and kept in an HttpOnly, SameSite=Strict cookie (script cannot
read it, another site's form cannot send it). Every form also carries the CSRF token derived
from it (:func:`.tokens.csrf_token`). The token itself is never written into a page.
"""

from __future__ import annotations

import hmac
import math
import urllib.parse
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from connectors.core.source.ownership.group import WorkUnit
from mailtap.commands.errors import InvalidInput
from mailtap.commands.mailboxes import SOURCES
from mailtap.console import charts
from mailtap.console.actions import Console
from mailtap.console.api import record_id_of
from mailtap.console.errors import BadCsrfToken, Forbidden
from mailtap.console.tokens import Principal, csrf_token
from mailtap.trace import trace as find_trace

COOKIE = "mailtap_console"
#: A login lasts a working day; the token file decides who may log in again.
COOKIE_MAX_AGE_S = 12 * 3600

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.globals["sparkline"] = charts.sparkline
templates.env.globals["status_colours"] = charts.STATUS_COLOURS
router = APIRouter(include_in_schema=False)

#: state -> colour class of the badge (connectors/imap/state.py, the EWS source's states).
STATE_CLASS = {
    "IDLE": "ok",
    "POLLING": "ok",
    "STREAMING": "ok",
    "SYNCING": "busy",
    "CONNECTING": "warn",
    "AUTHENTICATING": "warn",
    "SELECTING": "warn",
    "DISCONNECTED": "warn",
    "BACKOFF": "bad",
    "STOPPED": "bad",
}
templates.env.globals["state_class"] = lambda state: STATE_CLASS.get(str(state), "unknown")
#: The cursor fields an operator reads first (IMAP; EWS has a watermark); the rest in the title.
CURSOR_FIELDS = ("uidvalidity", "last_uid", "highestmodseq", "watermark")


def cursor_text(cursor: dict[str, Any]) -> str:
    """``uidvalidity=… last_uid=…``: the telling fields of a cursor, else its first three."""
    keys = [k for k in CURSOR_FIELDS if k in cursor] or list(cursor)[:3]
    return " ".join(f"{k}={cursor[k]}" for k in keys)


templates.env.globals["cursor_text"] = cursor_text


def _console(request: Request) -> Console:
    found: Console = request.app.state.console
    return found


def logged_in(request: Request) -> tuple[Principal, str] | None:
    token = request.cookies.get(COOKIE)
    principal = _console(request).tokens.lookup(token)
    return (principal, str(token)) if principal is not None else None


async def form_of(request: Request) -> dict[str, str]:
    """The urlencoded form (the body limit applies before this reads it)."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}


async def acting(request: Request) -> tuple[Principal, dict[str, str]]:
    """The operator behind a form post, its CSRF token checked."""
    session = logged_in(request)
    if session is None:
        raise Forbidden("log in first (your session ended or the token was rotated)")
    who, token = session
    form = await form_of(request)
    if not hmac.compare_digest(form.get("csrf", ""), csrf_token(token)):
        raise BadCsrfToken("the form's CSRF token is missing or wrong; reload the page")
    if not who.may_act:
        raise Forbidden(f"{who.name} has the viewer role; this action needs an operator token")
    return who, form


def done(request: Request, message: str, result: dict[str, Any]) -> Response:
    if request.headers.get("accept", "").startswith("application/json"):
        return JSONResponse({"message": message, **result})
    return RedirectResponse("/?" + urllib.parse.urlencode({"flash": message}), status_code=303)


def error_page(request: Request, status: int, message: str) -> Response:
    return templates.TemplateResponse(
        request, "error.html", {"status": status, "message": message}, status_code=status
    )


@router.get("/login")
def login_form(request: Request) -> Response:
    return templates.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login")
async def login(request: Request) -> Response:
    token = (await form_of(request)).get("token", "").strip()
    if _console(request).tokens.lookup(token) is None:
        return templates.TemplateResponse(
            request, "login.html", {"error": "That token is not valid."}, status_code=401
        )
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=_console(request).settings.secure_cookie,
        path="/",
    )
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    session = logged_in(request)
    if session is not None:
        form = await form_of(request)
        if not hmac.compare_digest(form.get("csrf", ""), csrf_token(session[1])):
            raise BadCsrfToken("the form's CSRF token is missing or wrong; reload the page")
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() and int(value) > 0 else 1


def _page(items: list[Any], page: int, size: int) -> dict[str, Any]:
    pages = max(1, math.ceil(len(items) / size))
    page = min(page, pages)
    return {
        "rows": items[(page - 1) * size : page * size],
        "page": page,
        "pages": pages,
        "total": len(items),
    }


@router.get("/", response_class=HTMLResponse)
def dashboard(request: Request) -> Response:
    session = logged_in(request)
    if session is None:
        return RedirectResponse("/login", status_code=303)
    who, token = session
    c = _console(request)
    snap = c.cache.get()
    params = request.query_params
    size = c.settings.page_size
    query = (params.get("q") or "").strip()[:1000]
    story = find_trace(c.cfg.kafka, query) if query else None
    report = snap.status
    context = {
        "who": who,
        "csrf": csrf_token(token),
        "snap": snap,
        "mailboxes": _page(snap.mailboxes, _int(params.get("mpage")), size),
        "dlq": _page(snap.dlq, _int(params.get("dpage")), size),
        "mpage": _int(params.get("mpage")),
        "dpage": _int(params.get("dpage")),
        "outcomes_svg": charts.outcome_bars(report["deliveries_per_hour"]),
        "deliveries": report["deliveries_in_window"],
        "bounce_rate": report["bounce_rate"],
        "lag": report["lag"],
        "health": report["health"],
        "query": query,
        "story": story,
        "flash": (params.get("flash") or "")[:300],
    }
    return templates.TemplateResponse(request, "console.html", context)


@router.post("/ui/dlq/{record}/replay")
async def replay(request: Request, record: str) -> Response:
    who, _ = await acting(request)
    result = _console(request).replay(who, record_id_of(record), reset_state=True)
    return done(request, f"{record} replayed to {result['replayed_to']}", result)


@router.post("/ui/dlq/{record}/drop")
async def drop(request: Request, record: str) -> Response:
    who, form = await acting(request)
    result = _console(request).drop(who, record_id_of(record), reason=form.get("reason", "")[:500])
    return done(request, f"{record} dropped", result)


@router.post("/ui/mailboxes/{verb}/{source}/{account}/{folder:path}")
async def mailbox(request: Request, verb: str, source: str, account: str, folder: str) -> Response:
    who, _ = await acting(request)
    if verb not in ("pause", "resume") or source not in SOURCES:
        raise InvalidInput(f"unknown mailbox action {verb} {source}")
    result = _console(request).change(who, WorkUnit(source, account, folder), verb)
    return done(request, f"{source}/{account}/{folder}: {verb}d", result)
