"""``mailtap bench graph``: the Microsoft Graph source against the Graph test server
(tests/graph_server, so it runs from a source checkout) and the local Kafka.

1. ingest: ``--messages`` mails of ~4 KB in one inbox; the source's backfill (delta pages,
   ``$value`` downloads, parse, one Kafka transaction per page) until every event is committed,
   against the baseline of the same server paged raw (delta pages + ``$value`` with 4 downloads
   in flight, no parsing, no Kafka: ``tests.graph_server.bench.raw_delta_paging``). Ratio target
   ≥ 0.8.
2. notification -> event latency over the webhook: a source with ``notifications.mode: webhook``
   and a sweep far beyond the run; a mail is added, the server notifies the source's HTTPS
   endpoint, the delta round publishes it; the time from adding it to the committed event, p50
   and p99 over ``--samples`` mails (target p99 < 1 s).
3. RSS per idle mailbox: VmRSS of this process before and after ``--idle`` mailboxes (one folder
   each) have started and gone idle, divided by their number (target ≤ 0.5 MB).

Figures, never assertions; the machine is shared, so only the ratio compares across runs.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from connectors.core.config import KafkaSettings, MailtapConfig, TopicNames, config_from_dict
from connectors.core.kafka.topics import ensure_topics
from connectors.graph.source import GraphSource
from mailtap.bench.ingest import _services
from mailtap.dev.process import free_port

__all__ = ["bench_graph"]

ACCOUNT = "bench"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _kafka(bootstrap: str) -> KafkaSettings:
    tag = uuid.uuid4().hex[:8]
    names = {f: f"{getattr(TopicNames(), f)}.bench-graph-{tag}" for f in TopicNames.model_fields}
    settings = KafkaSettings(bootstrap_servers=bootstrap, topics=TopicNames(**names))
    ensure_topics(settings, retry_tiers=["1m"])
    return settings


def _config(
    graph: Any, kafka: KafkaSettings, work: Path, accounts: list[dict[str, Any]], **section: Any
) -> MailtapConfig:
    from tests.graph_server.fixture import CLIENT_ID, CLIENT_SECRET

    authority, _, tenant = graph.authority.rpartition("/")
    return config_from_dict(
        {
            "kafka": kafka.model_dump(mode="json"),
            "claim_check": {"url": (work / "claims").as_uri()},
            "health": {"port": 0},
            "graph": {
                "tenant_id": tenant,
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "authority_host": authority,
                "api_base": graph.graph_url,
                "ca_file": str(graph.ca_file),
                "accounts": accounts,
                **section,
            },
        }
    )


@contextlib.contextmanager
def _running(cfg: MailtapConfig) -> Iterator[GraphSource]:
    source = GraphSource.from_config(cfg, serve_health=False)
    source.start()
    try:
        yield source
    finally:
        source.stop()


def _published(source: GraphSource) -> int:
    return sum(w.events_published for w in source.workers)


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("the Graph source did not get there in time")
        time.sleep(0.005)


def _ingest(graph: Any, kafka: KafkaSettings, work: Path, messages: int) -> dict[str, Any]:
    from tests.graph_server.bench import raw_delta_paging, seed
    from tests.graph_server.fixture import USER, app_token

    seed(graph, USER, messages)
    raw = raw_delta_paging(graph, app_token(graph), USER, page_size=100, mime=True)
    cfg = _config(
        graph,
        kafka,
        work,
        [{"name": ACCOUNT, "user": USER, "start": "all"}],
        batch_size=100,
        sweep_interval_seconds=600,
    )
    started = time.monotonic()
    with _running(cfg) as source:
        _wait(lambda: _published(source) >= messages, 600)
        seconds = time.monotonic() - started
    ingest_rate = messages / seconds
    return {
        "messages": messages,
        "raw_delta_paging_per_s": round(raw.messages_per_second, 1),
        "ingest_per_s": round(ingest_rate, 1),
        "ratio": round(ingest_rate / raw.messages_per_second, 3),
        "ratio_target": 0.8,
    }


def _latency(graph: Any, kafka: KafkaSettings, work: Path, samples: int) -> dict[str, Any]:
    user = "latency@example.com"
    graph.add_mailbox(user)
    pair = graph.issue_webhook_certificate(work / "hook")
    port = free_port()
    notifications = {
        "mode": "webhook",
        "public_url": f"https://127.0.0.1:{port}",
        "listen_host": "127.0.0.1",
        "listen_port": port,
        "certificate_file": str(pair.certificate),
        "key_file": str(pair.key),
        "client_state": uuid.uuid4().hex,
    }
    cfg = _config(
        graph,
        kafka,
        work,
        [{"name": "latency", "user": user, "start": "all"}],
        sweep_interval_seconds=3600,
        notifications=notifications,
    )
    waits: list[float] = []
    with _running(cfg) as source:
        _wait(
            lambda: (
                bool(source.workers)
                and source.workers[0].subscription_id is not None
                and source.workers[0].state.value == "WAITING"
            ),
            60,
        )
        for n in range(samples):
            raw = (
                f"From: a@example.org\r\nTo: {user}\r\nSubject: latency {n}\r\n"
                f"Message-ID: <latency-{n}-{uuid.uuid4().hex}@example.org>\r\n\r\nhello\r\n"
            ).encode()
            before = _published(source)
            added = time.monotonic()
            graph.add_message(user, raw)
            _wait(lambda before=before: _published(source) > before, 60)
            waits.append(time.monotonic() - added)
    waits.sort()
    return {
        "samples": samples,
        "p50_ms": round(statistics.median(waits) * 1000, 1),
        "p99_ms": round(waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000, 1),
        "p99_target_ms": 1000,
    }


def _idle_rss(graph: Any, kafka: KafkaSettings, work: Path, mailboxes: int) -> dict[str, Any]:
    accounts = []
    for n in range(mailboxes):
        user = f"idle{n}@example.com"
        graph.add_mailbox(user)
        accounts.append({"name": f"idle{n}", "user": user, "start": "all"})
    cfg = _config(graph, kafka, work, accounts, sweep_interval_seconds=3600)
    before = _rss_mb()
    with _running(cfg) as source:
        _wait(
            lambda: (
                len(source.workers) == mailboxes
                and all(w.state.value == "WAITING" for w in source.workers)
            ),
            300,
        )
        time.sleep(1.0)
        after = _rss_mb()
    return {
        "mailboxes": mailboxes,
        "rss_before_mb": round(before, 1),
        "rss_idle_mb": round(after, 1),
        "mb_per_idle_mailbox": round((after - before) / mailboxes, 3),
        "target_mb": 0.5,
    }


def bench_graph(*, messages: int, samples: int, idle: int) -> dict[str, Any]:
    # The console script's sys.path starts at the venv's bin/: the checkout holding this
    # (editable) install has the test server next to mailtap/.
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "tests" / "graph_server").is_dir() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        from tests.graph_server.fixture import running_server
    except ImportError:
        raise RuntimeError(
            "mailtap bench graph needs the Graph test server of a source checkout "
            "(tests/graph_server): run it from the repository root"
        ) from None
    info = _services()
    figures: dict[str, Any] = {"bench": "graph"}
    with tempfile.TemporaryDirectory() as tmp, running_server() as graph:
        work = Path(tmp)
        kafka = _kafka(info.kafka.bootstrap_servers)
        _say(f"ingest: {messages} messages ...")
        figures["ingest"] = _ingest(graph, kafka, work, messages)
        _say(f"  {figures['ingest']}")
        _say(f"notification -> event latency: {samples} mails over the webhook ...")
        figures["notification_latency"] = _latency(
            graph, _kafka(info.kafka.bootstrap_servers), work, samples
        )
        _say(f"  {figures['notification_latency']}")
        _say(f"RSS: {idle} idle mailboxes ...")
        figures["idle_rss"] = _idle_rss(graph, _kafka(info.kafka.bootstrap_servers), work, idle)
        _say(f"  {figures['idle_rss']}")
    return figures
