"""``/api/v1``: the REST admin API, in Kafka Connect's style (resources, ``PUT …/pause`` and
``…/resume``, errors as ``{"error_code": 404, "message": "…"}``).

Every request carries ``Authorization: Bearer TOKEN`` (:mod:`.tokens`); a viewer may GET, an
operator may also POST/PUT/DELETE. Lists are paged on the server (``?page=1&per_page=50``) and
answer ``{"items": [...], "page": 1, "per_page": 50, "total": N, "taken_at": ...}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from connectors.core.source.ownership.group import WorkUnit
from connectors.smtp.suppression import REASONS
from mailtap.commands import dlq, suppressions
from mailtap.commands.errors import InvalidInput, UnknownTarget
from mailtap.commands.mailboxes import SOURCES
from mailtap.console.actions import Console
from mailtap.console.errors import Forbidden, Unauthorized
from mailtap.console.tokens import Principal
from mailtap.trace import trace as find_trace

API_PREFIX = "/api/v1"
PER_PAGE_MAX = 500


def console(request: Request) -> Console:
    found: Console = request.app.state.console
    return found


def viewer(request: Request) -> Principal:
    """Any valid bearer token (401 otherwise)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    principal = console(request).tokens.lookup(
        token.strip() if scheme.lower() == "bearer" else None
    )
    if principal is None:
        raise Unauthorized("a valid bearer token is needed: Authorization: Bearer TOKEN")
    return principal


def operator(who: Annotated[Principal, Depends(viewer)]) -> Principal:
    """An operator's token (403 for a viewer)."""
    if not who.may_act:
        raise Forbidden(f"{who.name} has the viewer role; this action needs an operator token")
    return who


Viewer = Annotated[Principal, Depends(viewer)]
Operator = Annotated[Principal, Depends(operator)]
Page = Annotated[int, Query(ge=1, description="1-based page number")]
PerPage = Annotated[int | None, Query(ge=1, le=PER_PAGE_MAX, description="rows per page")]


def paged(items: list[Any], page: int, per_page: int, **extra: Any) -> dict[str, Any]:
    start = (page - 1) * per_page
    return {
        "items": items[start : start + per_page],
        "page": page,
        "per_page": per_page,
        "total": len(items),
        **extra,
    }


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MailboxIn(Strict):
    source: Literal["imap", "ews"] = Field(description="the source kind")
    account: str = Field(min_length=1, max_length=200, description="an account of the config")
    folder: str = Field(min_length=1, max_length=500, description="the folder to publish")


class ReplayIn(Strict):
    reset_state: bool = Field(
        default=True,
        description="also forget the sink's DONE state (needed for a command it gave up on)",
    )


class DropIn(Strict):
    reason: str = Field(default="", max_length=500, description="why, kept with the drop")


class SuppressionIn(Strict):
    address: str = Field(min_length=3, max_length=320, description="the address to suppress")
    reason: str = Field(default="MANUAL", description=f"one of {', '.join(REASONS)}")
    note: str | None = Field(default=None, max_length=500, description="free text")


def unit_of(source: str, account: str, folder: str) -> WorkUnit:
    if source not in SOURCES:
        raise UnknownTarget(f"unknown source {source!r}; expected one of {sorted(SOURCES)}")
    return WorkUnit(source, account, folder)


router = APIRouter(prefix=API_PREFIX)
MAILBOX = "/mailboxes/{source}/{account}/{folder:path}"


@router.get("/", summary="Version and where to start")
def root(who: Viewer) -> dict[str, Any]:
    return {"service": "mailtap console", "api": "v1", "you": {"name": who.name, "role": who.role}}


@router.get("/status", summary="Counts, delivery outcomes per hour, bounce rate")
def status(who: Viewer, request: Request) -> dict[str, Any]:
    snap = console(request).cache.get()
    report = snap.status
    return {
        "taken_at": snap.taken_at.isoformat(timespec="seconds"),
        "window_seconds": report["window_seconds"],
        "mailboxes": len(snap.mailboxes),
        "dlq_open": len(snap.dlq),
        "deliveries_in_window": report["deliveries_in_window"],
        "deliveries_per_hour": report["deliveries_per_hour"],
        "bounce_rate": report["bounce_rate"],
    }


@router.get("/mailboxes", summary="Mailboxes: owner, state, last sync age, cursor, DLQ count")
def list_mailboxes(who: Viewer, request: Request, page: Page = 1, per_page: PerPage = None) -> Any:
    c = console(request)
    snap = c.cache.get()
    return paged(
        snap.mailboxes,
        page,
        per_page or c.settings.page_size,
        taken_at=snap.taken_at.isoformat(timespec="seconds"),
    )


@router.get(MAILBOX, summary="One mailbox")
def get_mailbox(who: Viewer, request: Request, source: str, account: str, folder: str) -> Any:
    name = str(unit_of(source, account, folder))
    for row in console(request).cache.get().mailboxes:
        if row["mailbox"] == name:
            return row
    raise UnknownTarget(f"unknown mailbox {name}")


@router.post("/mailboxes", status_code=201, summary="Add a folder of a configured account")
def add_mailbox(who: Operator, request: Request, body: MailboxIn) -> Any:
    return console(request).change(who, unit_of(body.source, body.account, body.folder), "add")


@router.delete(MAILBOX, summary="Remove a mailbox (its cursor is kept)")
def remove_mailbox(who: Operator, request: Request, source: str, account: str, folder: str) -> Any:
    return console(request).change(who, unit_of(source, account, folder), "remove")


@router.put(MAILBOX + "/pause", summary="Stop publishing (as remove; the cursor is kept)")
def pause_mailbox(who: Operator, request: Request, source: str, account: str, folder: str) -> Any:
    return console(request).change(who, unit_of(source, account, folder), "pause")


@router.put(MAILBOX + "/resume", summary="Publish again from its cursor")
def resume_mailbox(who: Operator, request: Request, source: str, account: str, folder: str) -> Any:
    return console(request).change(who, unit_of(source, account, folder), "resume")


@router.post(MAILBOX + "/rewind", summary="Forget the cursor of a paused mailbox")
def rewind_mailbox(who: Operator, request: Request, source: str, account: str, folder: str) -> Any:
    return console(request).change(who, unit_of(source, account, folder), "rewind")


@router.get("/dlq", summary="Open dead letters, newest first")
def list_dlq(
    who: Viewer,
    request: Request,
    page: Page = 1,
    per_page: PerPage = None,
    kind: Literal["command", "source"] | None = None,
) -> Any:
    c = console(request)
    snap = c.cache.get()
    rows = [r for r in snap.dlq if kind is None or r["kind"] == kind]
    return paged(rows, page, per_page or c.settings.page_size, taken_at=snap.taken_at.isoformat())


@router.get("/dlq/{record}", summary="One dead letter with its error, headers and value")
def show_dlq(who: Viewer, request: Request, record: str) -> Any:
    c = console(request)
    seen, note = dlq.find_record(c.cfg.kafka, c.cfg.kafka.topics.dlq, record_id_of(record))
    return dlq.details(c.cfg, seen, note)


@router.post("/dlq/{record}/replay", summary="Send the command again; the record is handled")
def replay_dlq(who: Operator, request: Request, record: str, body: ReplayIn | None = None) -> Any:
    reset = (body or ReplayIn()).reset_state
    return console(request).replay(who, record_id_of(record), reset_state=reset)


@router.post("/dlq/{record}/drop", summary="Mark handled without sending")
def drop_dlq(who: Operator, request: Request, record: str, body: DropIn | None = None) -> Any:
    return console(request).drop(who, record_id_of(record), reason=(body or DropIn()).reason)


@router.get("/suppressions", summary="Suppressed addresses")
def list_suppressions(
    who: Viewer, request: Request, page: Page = 1, per_page: PerPage = None
) -> Any:
    c = console(request)
    rows = [
        {"address": key, **entry}
        for key, entry in sorted(suppressions.read_list(c.cfg.kafka).items())
        if entry.get("suppressed")
    ]
    return paged(rows, page, per_page or c.settings.page_size)


@router.post("/suppressions", status_code=201, summary="Stop sending to an address")
def add_suppression(who: Operator, request: Request, body: SuppressionIn) -> Any:
    return console(request).suppress(who, body.address, reason=body.reason, note=body.note)


@router.delete("/suppressions/{address}", summary="Send to an address again")
def remove_suppression(who: Operator, request: Request, address: str) -> Any:
    return console(request).unsuppress(who, address)


@router.get("/deliveries", summary="The story of one mail: event, workflow, command, deliveries")
def deliveries(
    who: Viewer,
    request: Request,
    q: Annotated[
        str,
        Query(
            min_length=1,
            max_length=1000,
            description="Message-ID, mail key, ticket or approval number, or command id",
        ),
    ],
) -> Any:
    c = console(request)
    found = find_trace(c.cfg.kafka, q)
    if found.matched_by is None:
        raise UnknownTarget(
            f"nothing matches {q!r} (looked for a command id, a mail key, a Message-ID and a "
            f"ticket or approval number)"
        )
    return found.as_json()


@router.get("/workflows", summary="Workflow runs, newest status of each, newest first")
def workflows(who: Viewer, request: Request, page: Page = 1, per_page: PerPage = None) -> Any:
    c = console(request)
    return paged(c.cache.get().workflows, page, per_page or c.settings.page_size)


@router.get("/lag", summary="Consumer lag per group and topic partition")
def lag(who: Viewer, request: Request) -> Any:
    snap = console(request).cache.get()
    return {"taken_at": snap.taken_at.isoformat(), "groups": snap.status["lag"]}


@router.get("/health", summary="Each instance's /healthz answer")
def health(who: Viewer, request: Request) -> Any:
    snap = console(request).cache.get()
    return {"taken_at": snap.taken_at.isoformat(), "instances": snap.status["health"]}


def record_id_of(text: str) -> str:
    partition, _, offset = text.partition(":")
    if not (partition.isdigit() and offset.isdigit()):
        raise InvalidInput(f"{text!r} is not a record id; write PARTITION:OFFSET, e.g. 0:42")
    return text
