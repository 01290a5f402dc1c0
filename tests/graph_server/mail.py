"""The mail endpoints of the Graph test server (v1.0, GET):

- ``/users/{id}/mailFolders`` and ``/mailFolders/{id or well-known name}`` with ``$select``
  (https://learn.microsoft.com/en-us/graph/api/user-list-mailfolders,
  https://learn.microsoft.com/en-us/graph/api/mailfolder-get);
- ``/users/{id}/mailFolders/{folder}/messages/delta`` (``delta.py``;
  https://learn.microsoft.com/en-us/graph/api/message-delta);
- ``/users/{id}/messages/{id}`` and ``.../$value``, also under ``mailFolders/{folder}/``
  (https://learn.microsoft.com/en-us/graph/api/message-get,
  https://learn.microsoft.com/en-us/graph/outlook-get-mime-message).

``Prefer: IdType="ImmutableId"`` switches message ids to immutable ones and is echoed in
``Preference-Applied`` (https://learn.microsoft.com/en-us/graph/outlook-immutable-id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from .auth import Principal
from .delta import DEFAULT_PAGE_SIZE, SyncStateGone
from .errors import GraphError
from .mailbox import Mailbox, MailFolder
from .preferences import max_page_size, prefers_immutable
from .resources import (
    FOLDER_PROPERTIES,
    MESSAGE_PROPERTIES,
    folder_json,
    message_json,
    removed_json,
)

if TYPE_CHECKING:
    from .server import GraphTestServer


class MailEndpoints:
    """A ``ServerExtension``: the GET endpoints on mail folders and messages."""

    def __init__(self, server: GraphTestServer) -> None:
        self.server = server

    def install(self, app: web.Application) -> None:
        return None

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
        if mailbox is None or request.method != "GET":
            return None
        names = [s.lower() for s in rest]
        immutable = prefers_immutable(request)
        if names == ["mailfolders"]:
            response = self._list_folders(mailbox, _folder_select(request))
        elif len(names) == 2 and names[0] == "mailfolders":
            response = self._get_folder(mailbox, rest[1], _folder_select(request))
        elif len(names) == 4 and names[0] == "mailfolders" and names[2:] == ["messages", "delta"]:
            response = self._delta(request, mailbox, rest[1], immutable)
        elif names[:1] == ["messages"] and len(names) in (2, 3):
            response = self._get_message(request, mailbox, rest[1], names[2:], immutable)
        elif names[:1] == ["mailfolders"] and names[2:3] == ["messages"] and len(names) in (4, 5):
            response = self._get_message(request, mailbox, rest[3], names[4:], immutable)
        else:
            return None
        if immutable:
            response.headers["Preference-Applied"] = 'IdType="ImmutableId"'
        return response

    # -- mail folders ------------------------------------------------------------------------------

    def _folder(self, mailbox: Mailbox, ref: str) -> MailFolder:
        # By id or well-known name (mailfolder resource); display names are not keys in Graph.
        folder = mailbox.folders.get(ref) or next(
            (f for f in mailbox.folders.values() if f.well_known_name == ref.lower()), None
        )
        if folder is None:
            raise GraphError(
                404, "ErrorItemNotFound", "The specified object was not found in the store."
            )
        return folder

    def _list_folders(self, mailbox: Mailbox, select: tuple[str, ...] | None) -> web.Response:
        with self.server.store.cond:
            root = mailbox.folder("msgfolderroot")
            assert root is not None
            value = [
                folder_json(mailbox, f, select)
                for f in mailbox.folders.values()
                if f.parent_id == root.folder_id
            ]
        context = f"{self.server.graph_url}/$metadata#users('{mailbox.address}')/mailFolders"
        return web.json_response({"@odata.context": context, "value": value})

    def _get_folder(
        self, mailbox: Mailbox, ref: str, select: tuple[str, ...] | None
    ) -> web.Response:
        with self.server.store.cond:
            body = folder_json(mailbox, self._folder(mailbox, ref), select)
        context = (
            f"{self.server.graph_url}/$metadata#users('{mailbox.address}')/mailFolders/$entity"
        )
        return web.json_response({"@odata.context": context, **body})

    # -- delta -------------------------------------------------------------------------------------

    def _delta(
        self, request: web.Request, mailbox: Mailbox, ref: str, immutable: bool
    ) -> web.Response:
        query = request.query
        unsupported = sorted(set(query) - {"$select", "$skiptoken", "$deltatoken", "changeType"})
        if unsupported:
            raise GraphError(
                400, "BadRequest", f"The test server does not model these options: {unsupported}."
            )
        select = _select(query.get("$select"))
        change_type = query.get("changeType")
        if change_type not in (None, "created", "updated", "deleted"):
            raise GraphError(400, "BadRequest", f"Invalid changeType '{change_type}'.")
        token = query.get("$skiptoken") or query.get("$deltatoken")
        page_size = max_page_size(request) or DEFAULT_PAGE_SIZE
        with self.server.store.cond:
            folder = self._folder(mailbox, ref)
            try:
                page = self.server.delta.page(
                    mailbox,
                    folder,
                    token=token,
                    select=select if token is None else None,
                    change_type=change_type if token is None else None,
                    page_size=page_size,
                )
            except SyncStateGone as gone:
                headers = {}
                if gone.code == "resyncRequired":
                    headers["Location"] = self._delta_link(mailbox, folder, {})
                    text = "The delta token is no longer valid; reset the sync state."
                else:
                    text = "The sync state generation was not found. The delta token is expired."
                raise GraphError(410, gone.code, text, headers) from None
            except KeyError:
                raise GraphError(
                    400,
                    "ErrorInvalidSyncStateData",
                    "The sync state data is corrupt or otherwise invalid.",
                ) from None
            state_select = select if token is None else self.server.delta.select_of(token)
            value = [
                self._delta_entry(mailbox, folder, e, immutable, state_select) for e in page.entries
            ]
        body: dict[str, Any] = {
            "@odata.context": f"{self.server.graph_url}/$metadata#Collection(message)"
        }
        if page.next_token is not None:
            body["@odata.nextLink"] = self._delta_link(
                mailbox, folder, {"$skiptoken": page.next_token}
            )
        else:
            assert page.delta_token is not None
            body["@odata.deltaLink"] = self._delta_link(
                mailbox, folder, {"$deltatoken": page.delta_token}
            )
        body["value"] = value
        response = web.json_response(body)
        if max_page_size(request):
            response.headers["Preference-Applied"] = f"odata.maxpagesize={page_size}"
        return response

    def _delta_entry(
        self,
        mailbox: Mailbox,
        folder: MailFolder,
        immutable_id: str,
        immutable: bool,
        select: tuple[str, ...] | None,
    ) -> dict[str, Any]:
        message = mailbox.messages.get(immutable_id)
        if message is not None and message.folder_id == folder.folder_id:
            return message_json(message, immutable=immutable, select=select)
        # Gone from this folder: its id as the client knew it here.
        return removed_json(
            immutable_id if immutable else folder.departed.get(immutable_id, immutable_id)
        )

    def _delta_link(self, mailbox: Mailbox, folder: MailFolder, params: dict[str, str]) -> str:
        # The shape of the documented links: .../mailfolders('{id}')/messages/delta?$skiptoken=
        base = f"{self.server.graph_url}/users/{mailbox.user_id}/mailFolders('{folder.folder_id}')/messages/delta"
        return f"{base}?{urlencode(params, safe='$')}" if params else base

    # -- messages ----------------------------------------------------------------------------------

    def _get_message(
        self, request: web.Request, mailbox: Mailbox, ref: str, tail: list[str], immutable: bool
    ) -> web.Response:
        with self.server.store.cond:
            message = mailbox.message(ref)
            if message is None:
                raise GraphError(
                    404, "ErrorItemNotFound", "The specified object was not found in the store."
                )
            if tail == ["$value"]:
                # The MIME content (outlook-get-mime-message); Graph labels it text/plain.
                return web.Response(body=message.mime, content_type="text/plain")
            if tail:
                raise GraphError(
                    400, "BadRequest", f"Resource not found for the segment '{tail[0]}'."
                )
            body = message_json(
                message, immutable=immutable, select=_select(request.query.get("$select"))
            )
        body["@odata.context"] = (
            f"{self.server.graph_url}/$metadata#users('{mailbox.address}')/messages/$entity"
        )
        return web.json_response(body)


def _folder_select(request: web.Request) -> tuple[str, ...] | None:
    value = request.query.get("$select")
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if name not in FOLDER_PROPERTIES:
            raise GraphError(
                400,
                "RequestBroker--ParseUri",
                f"Could not find a property named '{name}' on type 'microsoft.graph.mailFolder'.",
            )
    return names


def _select(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    for name in names:
        if name not in MESSAGE_PROPERTIES:
            raise GraphError(
                400,
                "RequestBroker--ParseUri",
                f"Could not find a property named '{name}' on type 'microsoft.graph.message'.",
            )
    return names
