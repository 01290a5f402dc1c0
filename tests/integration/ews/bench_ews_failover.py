"""Figures (never assertions): Exchange source failover with 2 and 3 instances in one group.

    MAILTAP_KAFKA_BOOTSTRAP=127.0.0.1:PORT .venv/bin/python -m tests.integration.ews.bench_ews_failover \\
        [--mailboxes 12] [--instances 2,3] [--rounds 3] [--session-timeout 6]

Issue 29, item 4 (target: p50 <= session timeout + 2 s), the EWS half of ``mailtap bench scale``'s
failover. Uses ``MAILTAP_KAFKA_BOOTSTRAP`` when set, else starts the local services in a
temporary state dir and stops them afterwards. The EWS test server runs in this process; each
source is a real ``mailtap run ews-source`` process (``ews.group``). Per instance count and
round, on fresh topics and a fresh group:

1. n instances share ``--mailboxes`` mailboxes; once every mailbox is owned by exactly one of
   them and STREAMING (/healthz), one mail each, all published;
2. **failover**: ``kill -9`` of the instance owning most, one new mail in each mailbox it owned,
   kill -> that mail's event (read_committed) per mailbox;
3. a new instance joins (the cooperative rebalance gives it a share); once settled,
   **hand-over**: SIGTERM of the instance owning most (it leaves the group), one new mail in each
   mailbox it owned, SIGTERM -> that mail's event.

Prints per round and the medians over rounds of the per-round p50s, with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import admin_client
from connectors.core.kafka.topics import ensure_topics
from mailtap.bench.scale import EventWatch, member_holds_partitions
from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import fast_server
from tests.integration.ews.ews_kafka import source_config
from tests.support.scaleout import Instance, exactly_once, start_instance, stop_instances

FAILOVER_MARGIN_S = 2.0
PHASE_TIMEOUT_S = 180.0
PASSWORD = "pw"
#: A settled mailbox: streaming, or catching up between two streaming requests.
LIVE = {"STREAMING", "CATCHING_UP"}


def _mime(account: str, n: int) -> bytes:
    return (
        f"From: Shop <orders@shop.example>\r\nTo: {account}@example.com\r\nSubject: Order {n}\r\n"
        f"Message-ID: <failover-{n}-{account}@shop.example>\r\n"
        f"Date: Sun, 29 Nov 2026 16:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nOrder number {n}\r\n"
    ).encode()


def _wait(condition: Any, what: str, instances: list[Instance], ended: set[str]) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not condition():
        dead = [i for i in instances if not i.alive and i.name not in ended]
        if dead or time.monotonic() > deadline:
            tail = "\n".join(dead[0].log_text().splitlines()[-30:]) if dead else ""
            raise RuntimeError(f"{what}: {'an instance exited' if dead else 'timed out'}\n{tail}")
        time.sleep(0.1)


def _streaming(instances: list[Instance], expected: set[str]) -> bool:
    """Every expected mailbox owned by exactly one live instance, and all of them live."""
    owned: dict[str, set[str]] = {}
    states: dict[str, str] = {}
    for instance in instances:
        if not instance.alive:
            continue
        try:
            health = instance.health()
        except (OSError, ValueError):
            return False
        owned[instance.name] = set(health.get("mailboxes", []))
        states.update(health.get("states", {}))
    return exactly_once(owned, expected) and set(states.values()) <= LIVE


def _most_owned(instances: list[Instance]) -> tuple[Instance, list[str]]:
    owned = {i.name: (i, i.owned() or set()) for i in instances if i.alive}
    instance, mailboxes = max(owned.values(), key=lambda pair: len(pair[1]))
    return instance, sorted(m.split("/")[1] for m in mailboxes)  # ews/<account>/inbox


def _delays(
    ews: EwsTestServer,
    watch: EventWatch,
    in_box: dict[str, int],
    accounts: list[str],
    since: float,
    instances: list[Instance],
    ended: set[str],
) -> list[float]:
    before = {a: in_box[a] for a in accounts}
    for account in accounts:
        in_box[account] += 1
        ews.deliver(f"{account}@example.com", _mime(account, in_box[account]))
    _wait(
        lambda: all(watch.count(a) > before[a] for a in accounts),
        f"the new mail of {len(accounts)} mailboxes that moved",
        instances,
        ended,
    )
    return sorted(watch.seen[a][before[a]] - since for a in accounts)


def one_round(
    bootstrap: str, n: int, mailboxes: int, session_timeout: float, work: Path
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    names = {f: f"{getattr(TopicNames(), f)}.bench-{tag}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(bootstrap_servers=bootstrap, topics=TopicNames(**names))
    ensure_topics(kafka, retry_tiers=["1m"])
    accounts = [f"fo{i}-{tag}" for i in range(mailboxes)]
    expected = {f"ews/{a}/inbox" for a in accounts}
    run: dict[str, Any] = {"instances": n, "mailboxes": mailboxes}
    # A "minute" of ConnectionTimeout lasts 60 s here: streams are not renewed every second.
    with fast_server(seconds_per_minute=60.0) as ews:
        config = source_config(kafka, ews, work / f"claims-{tag}")
        template = config["ews"]["accounts"][0]
        config["ews"]["accounts"] = []
        for account in accounts:
            ews.add_mailbox(f"{account}@example.com", PASSWORD)
            config["ews"]["accounts"].append(
                {
                    **template,
                    "name": account,
                    "email": f"{account}@example.com",
                    "password": PASSWORD,
                }
            )
        config["ews"]["group"] = {
            "id": f"bench-ews-failover-{tag}",
            "work_topic": f"mailtap.ews-work.bench-{tag}",
            "session_timeout_seconds": session_timeout,
        }
        watch = EventWatch(kafka)
        in_box = dict.fromkeys(accounts, 0)
        ended: set[str] = set()
        instances = [start_instance("ews-source", config, work, f"{tag}-e{k}") for k in range(n)]
        try:
            group, admin = config["ews"]["group"]["id"], admin_client(kafka)

            def settled() -> bool:
                # Every live instance holds work partitions in a stable group (not mid-join).
                return _streaming(instances, expected) and all(
                    member_holds_partitions(admin, group, i.proc.pid) for i in instances if i.alive
                )

            _wait(settled, "every mailbox streaming", instances, ended)
            _delays(ews, watch, in_box, accounts, time.monotonic(), instances, ended)

            victim, orphaned = _most_owned(instances)
            ended.add(victim.name)
            victim.proc.kill()
            killed = time.monotonic()
            victim.proc.wait(10)
            delays = _delays(ews, watch, in_box, orphaned, killed, instances, ended)
            run["orphaned_mailboxes"] = len(orphaned)
            run["failover_s_p50"] = round(statistics.median(delays), 2)
            run["failover_s_max"] = round(delays[-1], 2)

            joiner = start_instance("ews-source", config, work, f"{tag}-e{n}")
            instances.append(joiner)
            _wait(settled, "settled after a join", instances, ended)
            leaving, handed = _most_owned(instances)
            ended.add(leaving.name)
            leaving.proc.terminate()
            stopped = time.monotonic()
            delays = _delays(ews, watch, in_box, handed, stopped, instances, ended)
            leaving.proc.wait(60)
            run["left_mailboxes"] = len(handed)
            run["handover_s_p50"] = round(statistics.median(delays), 2)
            run["handover_s_max"] = round(delays[-1], 2)
            run["events"] = watch.count()
        finally:
            stop_instances(instances)
            watch.close()
    print(f"  {run}", file=sys.stderr, flush=True)
    return run


def bench(
    bootstrap: str,
    mailboxes: int,
    counts: list[int],
    rounds: int,
    session_timeout: float,
    work: Path,
) -> dict[str, Any]:
    target = session_timeout + FAILOVER_MARGIN_S
    figures: dict[str, Any] = {
        "mailboxes": mailboxes,
        "session_timeout_seconds": session_timeout,
        "failover_target_p50_seconds": target,
    }
    for n in counts:
        print(f"{n} instances, {rounds} rounds ...", file=sys.stderr, flush=True)
        runs = [one_round(bootstrap, n, mailboxes, session_timeout, work) for _ in range(rounds)]
        summary: dict[str, Any] = {"runs": runs}
        for what in ("failover_s_p50", "handover_s_p50"):
            values = sorted(r[what] for r in runs)
            summary[f"{what}_median"] = round(statistics.median(values), 2)
            summary[f"{what}_range"] = [values[0], values[-1]]
        summary["meets_target"] = summary["failover_s_p50_median"] <= target
        figures[f"instances_{n}"] = summary
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mailboxes", type=int, default=12)
    parser.add_argument("--instances", default="2,3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-timeout", type=float, default=6.0)
    args = parser.parse_args()
    counts = [int(n) for n in args.instances.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ews-failover-bench-"))
    bootstrap = os.environ.get("MAILTAP_KAFKA_BOOTSTRAP")
    state_dir = None
    try:
        if not bootstrap:
            from mailtap.dev import up

            state_dir = work / "services"
            state_dir.mkdir()
            print(f"starting local services in {state_dir} ...", file=sys.stderr)
            bootstrap = up(state_dir).kafka.bootstrap_servers
        figures = bench(bootstrap, args.mailboxes, counts, args.rounds, args.session_timeout, work)
        print(json.dumps(figures, sort_keys=True))
    finally:
        if state_dir is not None:
            from mailtap.dev import down

            down(state_dir)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
