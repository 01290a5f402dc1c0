"""The ``Prefer`` request header (RFC 7240) as Graph reads it: ``odata.maxpagesize=N``
(https://learn.microsoft.com/en-us/graph/api/message-delta, "Request headers") and
``IdType="ImmutableId"`` (https://learn.microsoft.com/en-us/graph/outlook-immutable-id); one
header with comma-separated preferences or several headers."""

from __future__ import annotations

from aiohttp import web

from .errors import GraphError


def preferences(request: web.Request) -> list[str]:
    values: list[str] = []
    for header in request.headers.getall("Prefer", []):
        values.extend(v.strip() for v in header.split(","))
    return values


def prefers_immutable(request: web.Request) -> bool:
    return any(v.replace(" ", "").lower() == 'idtype="immutableid"' for v in preferences(request))


def max_page_size(request: web.Request) -> int | None:
    for value in preferences(request):
        name, _, size = value.partition("=")
        if name.strip().lower() == "odata.maxpagesize":
            try:
                return int(size)
            except ValueError:
                raise GraphError(
                    400, "BadRequest", f"Invalid odata.maxpagesize '{size}'."
                ) from None
    return None
