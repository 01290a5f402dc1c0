"""``mailtap bench coldstart``: ``mailtap dev up`` on a fresh state dir, then the components'
first registrations, as ``make demo`` does on a fresh machine (issue 29, "Cold start").

One round:

1. ``up()`` into a new state directory: its own Kafka, registry, Dovecot and SMTP server;
   timed from the call to its return;
2. right after, the registrations of the components that start together (imap-source, streams,
   smtp-sink): for each of ``mail.events``, ``mail.workflow``, ``mail.commands`` and
   ``mail.delivery`` one thread sets the compatibility of ``T-key`` and ``T-value`` and registers
   both schemas, the calls connectors.core.schemaregistry makes, but over plain HTTP without its
   retries, so that every HTTP 5xx is counted;
3. the baseline of the same run: the same calls for four more topics on the now warm registry.

Printed per round and as medians: ``up_s``, ``ready_s`` (up's start -> the first registration
answered with an id: what a source's first write waits for), ``first_registration_s`` (up's
return -> that answer), ``all_registered_s`` (up's return -> every subject registered),
``http_errors``, ``warm_registration_s`` (the baseline's slowest registration) and the ratio of
the first to the warm one. Figures, not assertions; the services are stopped after each round.

Runs on any checkout that has ``mailtap.dev.up`` (copy this file into an older one for an A/B).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mailtap.dev import down, up

TOPICS = ("mail.events", "mail.workflow", "mail.commands", "mail.delivery")
#: A hang guard: the slowest first registration seen before the fix took ~60 s.
REQUEST_TIMEOUT_S = 120.0


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _value_schema(topic: str) -> str:
    """A record of its own per topic (a new content, as each mailtap topic's schema is)."""
    name = "".join(part.title() for part in topic.split("."))
    field = {"name": "id", "type": "string", "doc": "an id"}
    return json.dumps({"type": "record", "name": name, "namespace": "bench", "fields": [field]})


def _call(url: str, method: str, body: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, {}


class _Registrations:
    """The four calls per topic from one thread each; answers with their times."""

    def __init__(self, url: str, topics: list[str]) -> None:
        self.url = url
        self.topics = topics
        self.answers: list[tuple[float, str, int, bool]] = []  # (at, call, status, registered)
        self._lock = threading.Lock()

    def _topic(self, topic: str) -> None:
        for subject, schema in ((f"{topic}-key", '"string"'), (f"{topic}-value", None)):
            text = schema or _value_schema(topic)
            status, _ = _call(
                f"{self.url}/config/{subject}", "PUT", {"compatibility": "FULL_TRANSITIVE"}
            )
            self._answer(f"PUT config/{subject}", status, False)
            status, body = _call(
                f"{self.url}/subjects/{subject}/versions", "POST", {"schema": text}
            )
            self._answer(f"POST {subject}", status, isinstance(body.get("id"), int))

    def _answer(self, call: str, status: int, registered: bool) -> None:
        with self._lock:
            self.answers.append((time.monotonic(), call, status, registered))

    def run(self) -> float:
        """Start every topic's thread at once; returns when they all ended (monotonic start)."""
        threads = [threading.Thread(target=self._topic, args=(t,)) for t in self.topics]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return start

    def first_registered(self) -> float:
        return min(at for at, _, _, ok in self.answers if ok)

    def last(self) -> float:
        return max(at for at, _, _, _ in self.answers)

    def errors(self) -> list[str]:
        return [f"{call} -> {status}" for _, call, status, _ in self.answers if status >= 300]


def one_round(index: int) -> dict[str, Any]:
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-bench-coldstart-"))
    state_dir.chmod(0o755)  # Dovecot's unprivileged mail processes reach the maildirs
    try:
        begin = time.monotonic()
        info = up(state_dir)
        returned = time.monotonic()
        if info.registry is None:
            raise RuntimeError("the services came up without a registry (MAILTAP_DEV_REGISTRY?)")
        cold = _Registrations(info.registry.url, [f"{t}.{index}" for t in TOPICS])
        cold.run()
        warm = _Registrations(info.registry.url, [f"{t}.{index}.warm" for t in TOPICS])
        warm_start = warm.run()
        first = cold.first_registered() - returned
        warm_s = warm.last() - warm_start
        figures = {
            "up_s": round(returned - begin, 2),
            "ready_s": round(cold.first_registered() - begin, 2),
            "first_registration_s": round(first, 3),
            "all_registered_s": round(cold.last() - returned, 3),
            "http_errors": len(cold.errors()),
            "errors": cold.errors(),
            "warm_registration_s": round(warm_s, 3),
            "first_vs_warm": round(first / warm_s, 1) if warm_s > 0 else None,
        }
    finally:
        down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
    _say(f"round {index}: {json.dumps(figures)}")
    return figures


def bench_coldstart(rounds: int) -> dict[str, Any]:
    results = [one_round(i) for i in range(rounds)]
    keys = ("up_s", "ready_s", "first_registration_s", "all_registered_s", "warm_registration_s")
    medians = {f"median_{k}": round(statistics.median(r[k] for r in results), 3) for k in keys}
    summary = {**medians, "http_errors": sum(r["http_errors"] for r in results), "rounds": results}
    _say(
        f"dev up {medians['median_up_s']} s; registry accepts the first registration "
        f"{medians['median_ready_s']} s after up's start, "
        f"{medians['median_first_registration_s']} s after its return "
        f"(warm baseline: {medians['median_warm_registration_s']} s for all four topics); "
        f"{summary['http_errors']} HTTP errors in {rounds} rounds"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(bench_coldstart(int(args[0]) if args else 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
