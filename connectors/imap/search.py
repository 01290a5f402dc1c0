"""UID SEARCH on an imapclient connection: the answer as UID ranges, ESEARCH where offered.

With ESEARCH (RFC 4731) the server sends the ranges themselves, so a folder of any size costs a
few bytes::

    C: A8 UID SEARCH RETURN (ALL) UID 41:*
    S: * ESEARCH (TAG "A8") UID ALL 41:57,60
    S: A8 OK Search completed.

Without it, the plain SEARCH answer (every UID) is compacted into ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from imapclient import IMAPClient
from imapclient.imapclient import _normalise_search_criteria

from connectors.imap.errors import ImapProtocolError
from connectors.imap.uidset import UidSet, parse_esearch
from connectors.imap.wire import wire

__all__ = ["SEARCH_OR_CHUNK", "any_message_id", "message_ids_in", "search"]


#: Message-IDs asked for in one SEARCH (``OR`` of ``HEADER Message-ID`` keys).
SEARCH_OR_CHUNK = 25


def any_message_id(message_ids: Sequence[str]) -> list[str]:
    """SEARCH criteria matching any of ``message_ids``: ``OR k1 OR k2 k3`` (RFC 3501 6.4.4).

    >>> any_message_id(["a@x", "b@x", "c@x"])
    ['OR', 'HEADER', 'Message-ID', 'a@x', 'OR', 'HEADER', 'Message-ID', 'b@x', 'HEADER', 'Message-ID', 'c@x']
    """
    criteria: list[str] = []
    for i, message_id in enumerate(message_ids):
        if i < len(message_ids) - 1:
            criteria.append("OR")
        criteria += ["HEADER", "Message-ID", message_id]
    return criteria


def search(client: IMAPClient, criteria: list[Any], *, esearch: bool) -> UidSet:
    """The UIDs matching ``criteria``, as ranges.

    With ESEARCH (RFC 4731) the server sends the ranges themselves
    (``UID SEARCH RETURN (ALL) ...``), so a folder of any size costs a few bytes here;
    without it, the plain SEARCH answer is compacted.
    """
    if not esearch:
        return UidSet.from_uids(client.search(criteria))
    args = [b"RETURN", b"(ALL)", *_normalise_search_criteria(criteria, None)]
    # imapclient has no ESEARCH: its raw command, with the untagged ESEARCH answer.
    lines = client._raw_command_untagged(b"SEARCH", args, response_name="ESEARCH")
    try:
        return parse_esearch(lines)
    except ValueError as exc:
        raise ImapProtocolError(f"search {criteria!r}: {exc}") from exc


def message_ids_in(
    client: IMAPClient, folder: str, message_ids: Sequence[str], *, esearch: bool
) -> set[str]:
    """Which of ``message_ids`` another folder holds (``SEARCH HEADER Message-ID``, read-only),
    for the expunge-vs-move decision.

    One EXAMINE for all of them, then one SEARCH per ``SEARCH_OR_CHUNK`` ids joined by OR:
    a mass delete (nothing found) costs a round trip per chunk; a chunk with a hit is asked
    again id by id, to know which ones. Leaves ``folder`` selected read-only: the caller
    re-selects its own folder.
    """
    found: set[str] = set()
    if not message_ids:
        return found
    with wire(f"examine {folder}"):
        if not client.folder_exists(folder):
            return found
        client.select_folder(folder, readonly=True)
    for start in range(0, len(message_ids), SEARCH_OR_CHUNK):
        chunk = message_ids[start : start + SEARCH_OR_CHUNK]
        with wire(f"search {folder}"):
            if len(chunk) > 1 and not search(client, any_message_id(chunk), esearch=esearch):
                continue
            found.update(m for m in chunk if search(client, any_message_id([m]), esearch=esearch))
    return found
