"""Run the Graph test server as its own process (what ``remote.spawn`` starts).

    python -m tests.graph_server [--port 0] [--event-hubs-bootstrap host:port]
                                 [--mailbox-concurrency 4] [--token-lifetime 3599]

Creates the mailbox and app of ``fixture.py`` (``USER``, ``CLIENT_ID`` / ``CLIENT_SECRET``),
prints one JSON line (``url``, ``authority``, ``graph_url``, ``ca_file``, ``tenant``,
``control_url``, ``user``, ``client_id``, ``client_secret``) and serves until stdin closes or
SIGTERM/SIGINT arrives; everything else goes through ``/_control/{operation}``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from .fixture import CLIENT_ID, CLIENT_SECRET, USER, running_server


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.graph_server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--event-hubs-bootstrap", default=None)
    parser.add_argument("--mailbox-concurrency", type=int, default=4)
    parser.add_argument("--token-lifetime", type=float, default=3599.0)
    args = parser.parse_args()
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())

    def watch_stdin() -> None:
        # The parent closes our stdin (or dies): time to go.
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    with running_server(
        port=args.port,
        event_hubs_bootstrap=args.event_hubs_bootstrap,
        mailbox_concurrency=args.mailbox_concurrency,
        token_lifetime=args.token_lifetime,
    ) as server:
        info = {
            "url": server.url,
            "authority": server.authority,
            "graph_url": server.graph_url,
            "ca_file": str(server.ca_file),
            "tenant": server.tenant,
            "control_url": f"{server.url}/_control",
            "user": USER,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
        }
        print(json.dumps(info), flush=True)
        done.wait()


if __name__ == "__main__":
    main()
