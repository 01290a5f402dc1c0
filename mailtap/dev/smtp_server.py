"""The development SMTP server: accepts every message and keeps it in a folder.

Run as its own process by `mailtap dev up`::

    python -m mailtap.dev.smtp_server --host 127.0.0.1 --port 2525 --folder .state/dev/smtp/received

Messages are stored by `mailtap.dev.received.store` and read back with
`mailtap.dev.received.received_messages`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import signal
from pathlib import Path

from aiosmtpd.smtp import SMTP, Envelope, Session

from mailtap.dev.received import store

log = logging.getLogger("mailtap.dev.smtp_server")

#: Large enough for the claim-check tests' attachments; aiosmtpd's default is 32 MiB too.
DATA_SIZE_LIMIT = 32 * 1024 * 1024


class RecordingHandler:
    """aiosmtpd handler that stores each message and answers 250."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        existing = len(list(folder.glob("*.json"))) if folder.exists() else 0
        self._sequence = itertools.count(existing + 1)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw = envelope.original_content or b""
        if isinstance(envelope.content, bytes) and not raw:
            raw = envelope.content
        path = store(
            self.folder,
            next(self._sequence),
            str(envelope.mail_from),
            [str(r) for r in envelope.rcpt_tos],
            raw,
        )
        log.info("stored from=%s rcpt=%s path=%s", envelope.mail_from, envelope.rcpt_tos, path)
        return "250 Message accepted for delivery"


async def serve(host: str, port: int, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    handler = RecordingHandler(folder)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(
            handler,
            hostname="mailtap-dev-smtp",
            data_size_limit=DATA_SIZE_LIMIT,
            enable_SMTPUTF8=True,
            decode_data=False,
        ),
        host=host,
        port=port,
    )
    stopped = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    log.info("listening on %s:%d, storing into %s", host, port, folder)
    async with server:
        await stopped.wait()
    log.info("stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(args.host, args.port, args.folder))


if __name__ == "__main__":
    main()
