"""``mailtap bench console``: first paint of the console's page with many mailboxes and dead
letters (issue 26's target: < 1 s with 1,000 mailboxes and 10,000 DLQ records).

One run:

1. writes ``--mailboxes`` cursor records on a fresh offsets topic (as the sources write them) and
   ``--dead-letters`` command dead letters on a fresh DLQ topic (with the sink's error headers);
2. starts the real ``mailtap run console`` on them and waits for its first reading of the topics
   (``/healthz`` 200), which it reports as ``snapshot_read_s``;
3. loads the page ``--rounds`` times in headless Chromium (Debian's, through Playwright) logged in
   as an operator, and takes the browser's own ``first-contentful-paint`` and the HTML's
   response time; the baseline is the same browser painting the small login page, so the ratio
   says what the data costs on this machine, whatever its load.

Figures, printed, never asserted. The run's topics are deleted at the end.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer
from playwright.sync_api import Page, sync_playwright

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import ensure_topics
from connectors.core.source.ownership.group import WorkUnit
from mailtap.bench.ingest import _delete_topics, _say, _services
from mailtap.components import Component, wait_for
from mailtap.dev.process import free_port
from mailtap.mailbox_data import cursor_key

#: The issue's target for the first paint.
TARGET_S = 1.0
CHROMIUM = "/usr/bin/chromium"
TOKEN = "bench-operator-" + "t" * 32


def _fill(kafka: KafkaSettings, mailboxes: int, dead_letters: int) -> None:
    producer = Producer({**producer_config(kafka), "linger.ms": 20})
    for n in range(mailboxes):
        unit = WorkUnit("imap", f"bench-{n:04d}", "INBOX")
        cursor = {"uidvalidity": 1700000000 + n, "last_uid": n * 7, "highestmodseq": n * 11}
        producer.produce(kafka.topics.offsets, key=cursor_key(unit), value=json.dumps(cursor))
    for n in range(dead_letters):
        producer.produce(
            kafka.topics.dlq,
            key=f"bench-command-{n:05d}".encode(),
            value=b"\x00" * 200,
            headers=[
                ("mailtap.error.reason", b"550 5.1.1 <someone@example.com>: no such user"),
                ("mailtap.error.class", b"GiveUp"),
                ("mailtap.error.topic", kafka.topics.commands.encode()),
                ("mailtap.error.partition", str(n % 3).encode()),
                ("mailtap.error.offset", str(n).encode()),
            ],
        )
        if n % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the benchmark's records were not acknowledged")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _paint(page: Page, url: str) -> dict[str, float]:
    page.goto(url, wait_until="load")
    # The paint entry is queued after the frame is presented, possibly after "load": observe it
    # (buffered) instead of reading the list once.
    fcp_ms = page.evaluate(
        """() => new Promise((resolve, reject) => {
            new PerformanceObserver((list) => {
                const entry = list.getEntriesByName("first-contentful-paint")[0];
                if (entry) resolve(entry.startTime);
            }).observe({type: "paint", buffered: true});
            setTimeout(() => reject(new Error("no first-contentful-paint within 30 s")), 30000);
        })"""
    )
    nav = page.evaluate(
        """() => { const n = performance.getEntriesByType("navigation")[0];
                   return [n.responseEnd - n.requestStart, n.transferSize]; }"""
    )
    return {"fcp": fcp_ms / 1000, "response": nav[0] / 1000, "bytes": nav[1]}


def bench_console(
    json_out: bool = False, mailboxes: int = 1000, dead_letters: int = 10_000, rounds: int = 5
) -> dict[str, Any]:
    info = _services()
    tag = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix="mailtap-bench-console-"))
    names = {f: f"{getattr(TopicNames(), f)}.bench-{tag}" for f in TopicNames.model_fields}
    base = yaml.safe_load(Path(info.config_path).read_text())
    kafka = KafkaSettings(
        bootstrap_servers=info.bootstrap_servers,
        schema_registry_url=base["kafka"].get("schema_registry_url"),
        topics=TopicNames(**names),
    )
    ensure_topics(kafka, retry_tiers=["1m"])
    figures: dict[str, Any] = {"mailboxes": mailboxes, "dead_letters": dead_letters}
    try:
        _say(f"writing {mailboxes} cursors and {dead_letters} dead letters ...")
        _fill(kafka, mailboxes, dead_letters)
        tokens = work / "tokens.yaml"
        tokens.write_text(yaml.safe_dump([{"name": "bench", "role": "operator", "token": TOKEN}]))
        port = free_port()
        config = work / "mailtap.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "kafka": {**base["kafka"], "topics": names},
                    "console": {"port": port, "tokens_file": str(tokens), "refresh_seconds": 600},
                }
            )
        )
        url = f"http://127.0.0.1:{port}"
        console = Component("console", config, work / "console.log").start()
        try:
            started = time.monotonic()
            if not wait_for(lambda: _healthy(url), 300, interval=0.1):
                raise RuntimeError(f"the console did not come up:\n{console.log_tail()}")
            figures["start_to_first_reading_s"] = round(time.monotonic() - started, 2)
            figures.update(_browse(url, rounds))
        finally:
            console.stop()
    finally:
        _delete_topics(kafka, tag)
    _report(figures)
    return figures


def _browse(url: str, rounds: int) -> dict[str, Any]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            page = context.new_page()
            page.goto(url + "/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("#mailboxes")
            page.close()
            full, login = [], []
            for _ in range(rounds):
                page = context.new_page()
                full.append(_paint(page, url + "/"))
                page.close()
                page = context.new_page()
                login.append(_paint(page, url + "/login"))
                page.close()
        finally:
            browser.close()

    def median(samples: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(s[key] for s in samples), 3)

    return {
        "rounds": rounds,
        "first_paint_s": median(full, "fcp"),
        "html_response_s": median(full, "response"),
        "html_bytes": int(full[0]["bytes"]),
        "baseline_login_first_paint_s": median(login, "fcp"),
        "ratio_to_baseline": round(median(full, "fcp") / max(median(login, "fcp"), 1e-6), 2),
        "target_s": TARGET_S,
    }


def _report(f: dict[str, Any]) -> None:
    _say(
        f"console page, {f['mailboxes']} mailboxes and {f['dead_letters']} dead letters "
        f"(median of {f['rounds']}):\n"
        f"  first contentful paint   {f['first_paint_s']:.3f} s (target < {f['target_s']} s)\n"
        f"  HTML response            {f['html_response_s']:.3f} s, {f['html_bytes']} bytes\n"
        f"  login page (baseline)    {f['baseline_login_first_paint_s']:.3f} s "
        f"-> ratio {f['ratio_to_baseline']}\n"
        f"  start to first reading   {f['start_to_first_reading_s']:.2f} s "
        f"(the console reads the topics once in the background; pages use that reading)"
    )
