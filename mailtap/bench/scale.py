"""``mailtap bench scale``: M mailboxes over 1, 2 and 3 IMAP source instances (``imap.group``).

Issue 12. One run creates M Dovecot accounts (one INBOX each, ``--mails`` mails in each) and, per
instance count n, on fresh topics:

1. spawns n ``mailtap run imap-source`` processes in one group (each its own /healthz) and reads
   ``mail.events`` (read_committed): **time to first event** (spawn -> the first event, and ->
   every mailbox's first event) and the **steady events/s** (the rate between 10 % and 90 % of
   the M x mails events: the backfill of all mailboxes at once, start-up and tail left out);
2. n = 1: once every mailbox is IDLE (its /healthz ``states``), the **RSS** of the source
   process and its children (/proc), compared with the same source running 1 mailbox:
   (RSS(M) - RSS(1)) / (M - 1) per idle IDLE mailbox; the baseline is printed;
3. n >= 2: ``kill -9`` of the instance owning most mailboxes, one new mail in each mailbox it
   owned, and the **failover time** kill -> that mail's event per orphaned mailbox (p50, max),
   against the target session timeout + 2 s;
4. n >= 2: a new instance joins in place of the killed one (it takes a share: the
   cooperative rebalance moves only what it gets), then the instance owning most is stopped
   cleanly (SIGTERM: it leaves the group), one new mail in each mailbox it owned, and the
   **hand-over time** SIGTERM -> that mail's event (p50, max): a clean leave must not wait for
   the session timeout.

``--with-startup`` also runs ``mailtap bench startup`` (1,000,000 events of other accounts,
minutes): the start-up figure of the issue. Figures, not assertions; the topics are deleted.

The dev Dovecot serves at most 256 IMAP processes (``service imap { process_limit }``), shared
with whatever else uses it: M = 200 needs it to be otherwise idle.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient
from imapclient import IMAPClient

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import admin_client, consumer_config
from connectors.core.kafka.topics import ensure_topic_specs, ensure_topics, topic_specs
from connectors.imap.indexlog import topic_spec as index_topic_spec
from mailtap.bench.ingest import _account, _delete_topics, _say, _services
from mailtap.dev import DevServices
from mailtap.dev.dovecot import add_users
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.process import die_with_parent, free_port, terminate

#: Issue 12's targets.
RSS_TARGET_MB = 0.5
FAILOVER_MARGIN_S = 2.0
#: A phase that has not completed within this long fails the run with what it saw.
PHASE_TIMEOUT_S = 600.0
PASSWORD = "bench"


@dataclass
class EventWatch:
    """Reads an events topic on a thread: per account, the times its events were seen."""

    kafka: KafkaSettings
    seen: dict[str, list[float]] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._consumer = Consumer(consumer_config(self.kafka, f"bench-scale-{uuid.uuid4().hex}"))
        self._consumer.subscribe([self.kafka.topics.events])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(1000, 0.2):
                key = msg.key()
                if msg.error() is not None or key is None:
                    continue
                now = time.monotonic()
                account = key.decode().split("/", 1)[0]
                with self._lock:
                    self.seen.setdefault(account, []).append(now)
                    self.times.append(now)
        self._consumer.close()

    def count(self, account: str | None = None) -> int:
        with self._lock:
            return len(self.times) if account is None else len(self.seen.get(account, []))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)


@dataclass
class Source:
    proc: subprocess.Popen[bytes]
    health_port: int
    log: Path
    #: Killed or stopped by the bench: its exit is no failure.
    ended_on_purpose: bool = False

    def health(self) -> dict[str, Any] | None:
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:  # 503 (e.g. BACKOFF): the body still tells
            body = exc.read()
        except (OSError, ValueError):
            return None
        detail: dict[str, Any] = json.loads(body)
        return detail

    def stop(self) -> None:
        if self.proc.poll() is None:
            terminate(self.proc)


def rss_bytes(pid: int) -> int:
    """Memory of ``pid`` and its descendants (the parse processes), from /proc: the sum of
    their proportional set sizes, so that pages they share (the interpreter and libraries a
    forked parse process shares with its parent) count once, not once per process as a sum of
    their RSS would."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended meanwhile
    return total


def bench_scale(
    json_out: bool,
    mailboxes: int = 200,
    instances: tuple[int, ...] = (1, 2, 3),
    mails: int = 3,
    session_timeout: float = 10.0,
    with_startup: bool = False,
    registry: bool = True,
) -> dict[str, Any]:
    """``registry``: the sources write through the dev stack's schema registry, as a default
    configuration does (one serde per schema per process, whatever the number of mailboxes);
    False, or a stack started without one, writes single-object Avro."""
    if mailboxes < 2:
        raise ValueError("--mailboxes must be at least 2 (the RSS baseline runs 1)")
    info = _services()
    registry_url = info.registry.url if registry and info.registry is not None else None
    if registry and registry_url is None:
        raise RuntimeError(
            "the running dev stack has no schema registry (MAILTAP_DEV_REGISTRY=off?): start "
            "it with one (`mailtap dev up`) or run the bench with --no-registry"
        )
    run = functools.partial(_round, registry_url=registry_url)
    tag = uuid.uuid4().hex[:8]
    accounts = [f"scale{i}-{tag}" for i in range(mailboxes)]
    users = {a: f"bench-{a}@example.com" for a in accounts}
    work = Path(tempfile.mkdtemp(prefix="mailtap-bench-scale-"))
    figures: dict[str, Any] = {
        "mailboxes": mailboxes,
        "mails_per_mailbox": mails,
        "session_timeout_seconds": session_timeout,
        "failover_target_p50_seconds": session_timeout + FAILOVER_MARGIN_S,
        "rss_target_mb_per_idle_mailbox": RSS_TARGET_MB,
        "rss_measure": "PSS summed over the source and its parse processes (rss_bytes)",
        "schema_registry": registry_url,
    }
    in_box = dict.fromkeys(accounts, mails)
    try:
        _say(f"creating {mailboxes} accounts with {mails} mails each ...")
        add_users(info.imap.passwd_file, [(u, PASSWORD) for u in users.values()])
        for account in accounts:
            _append(info, users[account], [f"{account}-{i}" for i in range(mails)])
        runs = []
        for n in instances:
            _say(f"{n} instance(s) ...")
            runs.append(run(info, work, tag, accounts, users, n, in_box, session_timeout))
        figures["runs"] = runs
        with_rss = [r for r in runs if "rss_bytes" in r]
        if with_rss:
            # After the backfill: what M mailboxes with their mail cost against 1 (the
            # allocator keeps what the backfill of M x mails used).
            _say("RSS baseline: the same source with 1 mailbox ...")
            base = run(info, work, tag, accounts[:1], users, 1, in_box, session_timeout)
            figures["rss_baseline_1_mailbox_mb"] = round(base["rss_bytes"] / 2**20, 1)
            figures[f"rss_{mailboxes}_mailboxes_mb"] = round(with_rss[0]["rss_bytes"] / 2**20, 1)
            per = (with_rss[0]["rss_bytes"] - base["rss_bytes"]) / (mailboxes - 1) / 2**20
            figures["rss_mb_per_mailbox_after_backfill"] = round(per, 3)
            # Idle: M empty mailboxes in IDLE against 1, what the target speaks of.
            _say(f"RSS of {mailboxes} idle (empty) mailboxes against 1 ...")
            idle = {f"idle{i}-{tag}": f"bench-idle{i}-{tag}@example.com" for i in range(mailboxes)}
            users.update(idle)
            add_users(info.imap.passwd_file, [(u, PASSWORD) for u in idle.values()])
            names = list(idle)
            in_box.update(dict.fromkeys(names, 0))
            many = run(info, work, f"{tag}-idle", names, users, 1, in_box, session_timeout)
            one = run(info, work, f"{tag}-idle", names[:1], users, 1, in_box, session_timeout)
            per_idle = (many["rss_bytes"] - one["rss_bytes"]) / (mailboxes - 1) / 2**20
            figures["rss_mb_per_idle_mailbox"] = round(per_idle, 3)
            figures["rss_meets_target"] = per_idle <= RSS_TARGET_MB
        failovers = [r["failover_s_p50"] for r in runs if "failover_s_p50" in r]
        failovers += [r["handover_s_p50"] for r in runs if "handover_s_p50" in r]
        if failovers:
            figures["failover_meets_target"] = all(
                f <= session_timeout + FAILOVER_MARGIN_S for f in failovers
            )
        if with_startup:
            from mailtap.bench.startup import bench_startup

            _say("start-up with 1,000,000 events of other accounts (mailtap bench startup) ...")
            figures["startup"] = bench_startup(
                json_out=True, other_events=1_000_000, other_accounts=1000, rounds=1
            )
        else:
            figures["startup"] = (
                "not run: add --with-startup (minutes) or run mailtap bench startup"
            )
        if not json_out:
            for key, value in figures.items():
                _say(f"{key}: {value}")
    finally:
        for user in users.values():
            info.doveadm("expunge", "-u", user, "mailbox", "INBOX", "all", check=False)
        shutil.rmtree(work, ignore_errors=True)
    return figures


def _append(info: DevServices, username: str, ids: list[str]) -> None:
    client = IMAPClient(info.imap.host, port=info.imap.port, ssl=False)
    client.login(username, PASSWORD)
    for mid in ids:
        client.append(
            "INBOX",
            f"Message-ID: <{mid}@example.com>\r\nFrom: a@example.com\r\nTo: b@example.com\r\n"
            f"Subject: scale {mid}\r\n\r\nhello\r\n".encode(),
        )
    client.logout()


def _config(
    info: DevServices,
    kafka: KafkaSettings,
    accounts: list[str],
    users: dict[str, str],
    round_tag: str,
    session_timeout: float,
    work: Path,
) -> dict[str, Any]:
    return {
        "kafka": kafka.model_dump(mode="json", exclude_none=True),
        "claim_check": {"url": (work / "claims").as_uri()},
        "imap": {
            "accounts": [
                {
                    **_account(info, users[account], PASSWORD, name=account),
                    "folders": ["INBOX"],
                    "start": "all",
                }
                for account in accounts
            ],
            "group": {
                "id": f"bench-scale-{round_tag}",
                "work_topic": f"mailtap.imap-work.bench-{round_tag}",
                "session_timeout_seconds": session_timeout,
            },
        },
    }


def _spawn(config: dict[str, Any], work: Path, name: str) -> Source:
    port = free_port()
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**config, "health": {"port": port}}))
    log = work / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MAILTAP_LOG_LEVEL": "INFO"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mailtap.cli", "run", "imap-source", "-c", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=env,
            preexec_fn=die_with_parent(),  # a killed bench leaves no source behind
        )
    return Source(proc, port, log)


def _wait(condition: Any, what: str, sources: list[Source]) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not condition():
        dead = [s for s in sources if s.proc.poll() is not None and not s.ended_on_purpose]
        if dead or time.monotonic() > deadline:
            tail = (
                "\n".join(dead[0].log.read_text(errors="replace").splitlines()[-30:])
                if dead
                else ""
            )
            raise RuntimeError(f"{what}: {'a source exited' if dead else 'timed out'}\n{tail}")
        time.sleep(0.1)


def _listed(kafka: KafkaSettings, topics: list[str], timeout: float = 120.0) -> None:
    """Wait until the metadata lists every topic just created: a busy broker can answer a
    moment without them, and a source that starts then stops at "topic ... is missing"."""
    admin = admin_client(kafka)
    deadline = time.monotonic() + timeout
    while True:
        listed = admin.list_topics(timeout=30).topics
        if all(t in listed and listed[t].partitions for t in topics):
            return
        if time.monotonic() > deadline:
            missing = [t for t in topics if t not in listed]
            raise RuntimeError(f"topics not listed after {timeout:.0f}s: {missing}")
        time.sleep(0.5)


def _owned(source: Source) -> set[str] | None:
    health = source.health()
    return None if health is None else set(health.get("mailboxes", []))


def _round(
    info: DevServices,
    work: Path,
    tag: str,
    accounts: list[str],
    users: dict[str, str],
    n: int,
    in_box: dict[str, int],
    session_timeout: float,
    registry_url: str | None = None,
) -> dict[str, Any]:
    """One instance count on fresh topics; ``in_box``: the mails each account's INBOX holds
    (a failover adds one to each orphaned mailbox)."""
    round_tag = f"{tag}-{n}-{len(accounts)}"
    names = {f: f"{getattr(TopicNames(), f)}.bench-{round_tag}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(
        bootstrap_servers=info.bootstrap_servers,
        topics=TopicNames(**names),
        schema_registry_url=registry_url,
    )
    # The source's own topics too (its key index changelog): every name waited for is created here.
    specs = [*topic_specs(kafka, retry_tiers=["1m"]), index_topic_spec(kafka)]
    ensure_topics(kafka, retry_tiers=["1m"])
    ensure_topic_specs(kafka, specs)
    _listed(kafka, [spec.name for spec in specs])
    config = _config(info, kafka, accounts, users, round_tag, session_timeout, work)
    expected = sum(in_box[a] for a in accounts)
    run: dict[str, Any] = {"instances": n, "mailboxes": len(accounts)}
    watch = EventWatch(kafka)
    sources: list[Source] = []
    try:
        spawned = time.monotonic()
        sources = [_spawn(config, work, f"r{round_tag}-i{k}") for k in range(n)]
        if expected:  # else: empty mailboxes, for the memory of idle ones
            _wait(
                lambda: all(watch.count(a) >= in_box[a] for a in accounts),
                f"{expected} events",
                sources,
            )
            firsts = [watch.seen[a][0] for a in accounts]
            run["first_event_s"] = round(min(firsts) - spawned, 2)
            run["every_mailbox_first_event_s"] = round(max(firsts) - spawned, 2)
            times = sorted(watch.times)
            low, high = times[int(len(times) * 0.1)], times[max(0, int(len(times) * 0.9) - 1)]
            span = high - low
            steady = (int(len(times) * 0.9) - int(len(times) * 0.1)) / span if span > 0 else None
            run["steady_events_per_s"] = round(steady, 1) if steady else None
            run["events"] = watch.count()

        def all_idle() -> bool:
            """Every mailbox IDLE, each on exactly one of the live instances."""
            states: dict[str, str] = {}
            owned = 0
            for source in sources:
                if source.proc.poll() is not None:
                    continue  # killed or stopped on purpose
                health = source.health()
                if health is None:
                    return False
                states.update(health.get("states", {}))
                owned += len(health.get("mailboxes", []))
            return len(states) == owned == len(accounts) and set(states.values()) == {"IDLE"}

        group_id, admin = config["imap"]["group"]["id"], admin_client(kafka)

        def group_settled() -> bool:
            """Every live instance holds work partitions in a stable group: a kill or a stop
            during the join's two-step rebalance would time another scenario."""
            return all(
                member_holds_partitions(admin, group_id, s.proc.pid)
                for s in sources
                if s.proc.poll() is None
            )

        _wait(lambda: all_idle() and group_settled(), "every mailbox IDLE", sources)
        if n == 1:
            time.sleep(3)  # let the allocator settle after the backfill
            run["rss_bytes"] = rss_bytes(sources[0].proc.pid)
            run["rss_mb"] = round(run["rss_bytes"] / 2**20, 1)
        if n >= 2:
            run.update(_failover(info, sources, users, watch, in_box))
            joiner = _spawn(config, work, f"r{round_tag}-i{n}")
            sources.append(joiner)
            _wait(
                lambda: all_idle() and group_settled(),
                "every mailbox IDLE after a new instance joined",
                sources,
            )
            run.update(_handover(info, sources, users, watch, in_box))
    finally:
        for source in sources:
            source.stop()
        watch.close()
        try:
            _delete_topics(kafka, round_tag)
        except (KafkaException, ValueError) as exc:  # never hide the round's own error
            _say(f"  the round's topics were not deleted: {exc}")
    _say(f"  {run}")
    return run


def _failover(
    info: DevServices,
    sources: list[Source],
    users: dict[str, str],
    watch: EventWatch,
    in_box: dict[str, int],
) -> dict[str, Any]:
    victim, orphaned = _most_owned(sources)
    sources[victim].ended_on_purpose = True
    sources[victim].proc.kill()
    killed = time.monotonic()
    _say(f"  kill -9 of instance {victim} ({len(orphaned)} mailboxes) at {_wall()}")
    sources[victim].proc.wait(10)
    delays = _new_mail_delays(info, sources, users, watch, in_box, orphaned, killed)
    return {
        "orphaned_mailboxes": len(orphaned),
        "failover_s_p50": round(statistics.median(delays), 2),
        "failover_s_max": round(delays[-1], 2),
    }


def _handover(
    info: DevServices,
    sources: list[Source],
    users: dict[str, str],
    watch: EventWatch,
    in_box: dict[str, int],
) -> dict[str, Any]:
    """SIGTERM of the live instance owning most: it stops its mailboxes and leaves the group,
    the others take them over at once (no session timeout)."""
    leaving, handed = _most_owned(sources)
    sources[leaving].ended_on_purpose = True
    sources[leaving].proc.terminate()
    stopped = time.monotonic()
    _say(f"  SIGTERM of instance {leaving} ({len(handed)} mailboxes) at {_wall()}")
    delays = _new_mail_delays(info, sources, users, watch, in_box, handed, stopped)
    sources[leaving].proc.wait(60)
    return {
        "left_mailboxes": len(handed),
        "handover_s_p50": round(statistics.median(delays), 2),
        "handover_s_max": round(delays[-1], 2),
    }


def member_holds_partitions(admin: AdminClient, group_id: str, pid: int) -> bool:
    """The group is stable and the member of process ``pid`` holds work partitions: a joiner
    has got its share (the cooperative rebalance takes two steps: revoke, then assign), so the
    instances' /healthz no longer shows the state before the join. False while the coordinator
    does not answer (it may be busy rebalancing): the caller asks again."""
    try:
        described = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id]
        group = described.result(15)
    except (KafkaException, TimeoutError):
        return False
    if group.state != ConsumerGroupState.STABLE:
        return False
    suffix = f":{pid}"  # member_client_id: mailtap-<source>@<host>:<pid>
    return any(
        m.client_id.endswith(suffix) and m.assignment and m.assignment.topic_partitions
        for m in group.members
    )


def _most_owned(sources: list[Source]) -> tuple[int, list[str]]:
    """The live instance owning most mailboxes, and their accounts."""
    owned = {i: _owned(s) or set() for i, s in enumerate(sources) if s.proc.poll() is None}
    chosen = max(owned, key=lambda i: len(owned[i]))
    return chosen, sorted(m.split("/")[1] for m in owned[chosen])  # imap/<account>/INBOX


def _wall() -> str:
    """Wall-clock time as the sources' log lines print it, to place an event in their logs."""
    return time.strftime("%H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"


def _new_mail_delays(
    info: DevServices,
    sources: list[Source],
    users: dict[str, str],
    watch: EventWatch,
    in_box: dict[str, int],
    accounts: list[str],
    since: float,
) -> list[float]:
    """One new mail in each of ``accounts``; sorted delays ``since`` -> its event."""
    before = {a: in_box[a] for a in accounts}
    for account in accounts:
        _append(info, users[account], [f"{account}-moved-{before[account]}"])
        in_box[account] += 1
    _wait(
        lambda: all(watch.count(a) > before[a] for a in accounts),
        f"the new mail of {len(accounts)} mailboxes that moved",
        sources,
    )
    return sorted(watch.seen[a][before[a]] - since for a in accounts)
