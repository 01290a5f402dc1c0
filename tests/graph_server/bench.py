"""The baseline of ``mailtap bench graph``: raw delta paging of the Graph test server, no Kafka.

What a client must at least do to read a folder through Graph: follow one delta round
(``$select`` of the event's properties, ``Prefer: odata.maxpagesize``, immutable ids) and,
with ``mime=True``, fetch every message's ``$value`` with at most ``concurrency`` requests in
flight (Outlook allows 4 per app per mailbox; throttling-limits). The source's ingest rate
divided by this rate is the ratio the issue's target (>= 0.8) is about.

    figures = raw_delta_paging(server, token, USER, mime=True)
    print(figures.messages_per_second)

or, standalone (starts its own server, prints JSON)::

    .venv/bin/python -m tests.graph_server.bench --messages 2000 [--size 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import time
from dataclasses import asdict, dataclass

import aiohttp

from .fixture import GraphEndpoint
from .server import GraphTestServer

#: The properties a mail event needs (what the source is expected to $select).
EVENT_SELECT = (
    "internetMessageId,subject,from,toRecipients,receivedDateTime,isRead,flag,categories,"
    "parentFolderId,changeKey,conversationId,hasAttachments"
)


@dataclass(frozen=True)
class DeltaPagingFigures:
    messages: int
    removed: int
    pages: int
    mime_bytes: int
    seconds: float

    @property
    def messages_per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def raw_delta_paging_async(
    server: GraphEndpoint,
    token: str,
    user: str,
    folder: str = "inbox",
    *,
    page_size: int = 100,
    mime: bool = True,
    concurrency: int = 4,
    delta_link: str | None = None,
) -> tuple[DeltaPagingFigures, str]:
    """One delta round of ``folder`` (from ``delta_link``, else a full one), the MIME of
    every message when ``mime``; returns the figures and the round's deltaLink."""
    context = ssl.create_default_context(cafile=str(server.ca_file))
    headers = {
        "Authorization": f"Bearer {token}",
        "Prefer": f'odata.maxpagesize={page_size}, IdType="ImmutableId"',
    }
    url = delta_link or (
        f"{server.graph_url}/users/{user}/mailFolders/{folder}/messages/delta?$select={EVENT_SELECT}"
    )
    gate = asyncio.Semaphore(concurrency)
    messages = removed = pages = mime_bytes = 0
    started = time.perf_counter()
    async with aiohttp.ClientSession(headers=headers, trust_env=False) as session:

        async def fetch_mime(message_id: str) -> int:
            async with gate:
                value_url = f"{server.graph_url}/users/{user}/messages/{message_id}/$value"
                async with session.get(value_url, ssl=context) as response:
                    response.raise_for_status()
                    return len(await response.read())

        while True:
            async with gate, session.get(url, ssl=context) as response:
                response.raise_for_status()
                body = await response.json()
            pages += 1
            present = [m["id"] for m in body["value"] if "@removed" not in m]
            removed += len(body["value"]) - len(present)
            messages += len(present)
            if mime and present:
                mime_bytes += sum(await asyncio.gather(*(fetch_mime(i) for i in present)))
            if "@odata.nextLink" in body:
                url = body["@odata.nextLink"]
                continue
            figures = DeltaPagingFigures(
                messages, removed, pages, mime_bytes, time.perf_counter() - started
            )
            return figures, str(body["@odata.deltaLink"])


def raw_delta_paging(
    server: GraphEndpoint, token: str, user: str, folder: str = "inbox", **options: object
) -> DeltaPagingFigures:
    """``raw_delta_paging_async`` for synchronous callers (a benchmark's main thread)."""
    figures, _ = asyncio.run(raw_delta_paging_async(server, token, user, folder, **options))  # type: ignore[arg-type]
    return figures


def seed(
    server: GraphTestServer, user: str, count: int, size: int = 4096, folder: str = "inbox"
) -> None:
    """``count`` distinct messages of about ``size`` bytes each (Message-IDs ``<bench-N@...>``)."""
    filler = ("x" * 76 + "\r\n") * max(1, size // 78)
    for n in range(count):
        mime = (
            f"From: Bench <bench@example.org>\r\nTo: {user}\r\nSubject: bench {n}\r\n"
            f"Message-ID: <bench-{n}@example.org>\r\nDate: Fri, 04 Dec 2026 10:00:00 +0000\r\n"
            f"\r\n{filler}"
        ).encode()
        server.add_message(user, mime, folder=folder, notify=False)


def main() -> None:
    from .fixture import USER, app_token, running_server

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--page-size", type=int, default=100)
    args = parser.parse_args()
    with running_server() as server:
        seed(server, USER, args.messages, args.size)
        token = app_token(server)
        delta_only = raw_delta_paging(server, token, USER, page_size=args.page_size, mime=False)
        with_mime = raw_delta_paging(server, token, USER, page_size=args.page_size, mime=True)
    report = {
        "messages": args.messages,
        "size": args.size,
        "delta_only": {
            **asdict(delta_only),
            "messages_per_second": round(delta_only.messages_per_second, 1),
        },
        "delta_and_mime": {
            **asdict(with_mime),
            "messages_per_second": round(with_mime.messages_per_second, 1),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
