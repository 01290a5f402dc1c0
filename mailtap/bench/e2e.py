"""``mailtap bench e2e``: APPEND into Dovecot → reply received by the SMTP server, p50/p99.

The whole pipeline runs as in production (``mailtap run imap-source|streams|smtp-sink`` child
processes) on per-run topics. Each sample is one new support request appended through IMAP; the
clock stops when the SMTP server has stored the ticket acknowledgement that answers it. Samples are
taken one at a time, so the figure is latency, not queueing.

The baseline, measured in the same run on the same Dovecot: the raw IDLE notification latency,
APPEND on one connection → ``* n EXISTS`` on another connection in IDLE. Dovecot delays IDLE
notifications by ~0.5 s by design (PITFALLS.md), so that is the floor for any IMAP trigger.
"""

from __future__ import annotations

import email
import email.policy
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import yaml
from aiosmtpd.controller import Controller
from imapclient import IMAPClient

from connectors.core.config import load_config
from connectors.core.kafka.topics import ensure_topics
from mailtap.components import Pipeline
from mailtap.dev import DevServices, scenario, status, up
from mailtap.dev import down as dev_down
from mailtap.dev.process import free_port

REPLY_TIMEOUT_S = 30.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _request(run: str, n: int) -> tuple[str, bytes]:
    mid = f"bench-{run}-{n}@customer.example"
    sender = f"customer{n}@customer.example"
    msg = email.message.EmailMessage()
    msg["Authentication-Results"] = (
        f"{scenario.AUTHSERV_ID}; dkim=pass header.d=customer.example; dmarc=pass header.from=customer.example"
    )
    msg["From"] = f"Customer {n} <{sender}>"
    msg["To"] = scenario.SUPPORT
    msg["Subject"] = f"Request {n}: the VPN drops every hour"
    msg["Message-ID"] = f"<{mid}>"
    msg.set_content("Hello,\n\nthe VPN connection drops every hour since Monday.\n")
    return mid, bytes(msg)


def raw_idle_latency(info: DevServices, username: str, password: str, samples: int) -> list[float]:
    """APPEND → EXISTS seen by a second connection in IDLE, in seconds."""
    out: list[float] = []
    with (
        IMAPClient(info.imap.host, info.imap.port, ssl=False, timeout=30) as watcher,
        IMAPClient(info.imap.host, info.imap.port, ssl=False, timeout=30) as writer,
    ):
        watcher.login(username, password)
        writer.login(username, password)
        watcher.select_folder("INBOX")
        for n in range(samples):
            watcher.idle()
            time.sleep(0.05)  # the server has entered IDLE before the APPEND
            _, raw = _request("raw", n)
            start = time.perf_counter()
            writer.append("INBOX", raw)
            deadline = start + 10
            seen = False
            while not seen and time.perf_counter() < deadline:
                seen = any(r[1] == b"EXISTS" for r in watcher.idle_check(timeout=1) if len(r) > 1)
            watcher.idle_done()
            if seen:
                out.append(time.perf_counter() - start)
    return out


class ReplyRecorder:
    """An SMTP server of the benchmark's own: it stamps each reply as its DATA completes.

    (Watching the shared dev SMTP folder instead would add the cost of listing a folder that
    grows with every run to each sample.)
    """

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        handler = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                now = time.perf_counter()
                parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
                handler.arrived.setdefault(str(parsed["In-Reply-To"] or "").strip("<>"), now)
                return "250 OK"

        self.port = free_port("127.0.0.1")
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def start(self) -> ReplyRecorder:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()


def _config(
    info: DevServices, run: str, username: str, password: str, folder: Path, smtp_port: int
) -> Path:
    base: dict[str, Any] = yaml.safe_load(info.config_path.read_text())
    account = dict(base["imap"]["accounts"][0])
    account.update(name=f"bench-{run}", username=username, password=password, start="all")
    streams = scenario.streams_section(f"bench-{run}")
    streams["rate_limit"] = {"max_replies": 1000, "window_seconds": 60}
    streams["data_dir"] = str(folder / "streams")
    doc = {
        "kafka": {
            **base["kafka"],
            "topics": {
                name: f"{default}.bench-{run}"
                for name, default in {
                    "events": "mail.events",
                    "commands": "mail.commands",
                    "retry_prefix": "mail.commands.retry",
                    "dlq": "mail.commands.dlq",
                    "delivery": "mail.delivery",
                    "offsets": "mailtap.offsets",
                    "workflow": "mail.workflow",
                }.items()
            },
        },
        "claim_check": base["claim_check"],
        "health": {"port": 0},
        "imap": {**base["imap"], "accounts": [account]},
        "streams": streams,
        "smtp": {
            **base["smtp"],
            "port": smtp_port,
            "retry_tiers": ["5s"],
            "group_id": f"bench-sink-{run}",
            "state_topic": f"mailtap.sink.state.bench-{run}",
            "instance_id": f"bench-{run}",
        },
    }
    path = folder / "mailtap.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def bench_e2e(json_out: bool, mails: int = 200) -> dict[str, Any]:
    say = (lambda *_: None) if json_out else click.echo
    started = status(None) is None
    info = up(None)
    run = uuid.uuid4().hex[:8]
    user = info.add_user(f"bench-{run}@example.com", "pw")
    folder = Path(tempfile.mkdtemp(prefix=f"mailtap-bench-e2e-{run}-"))
    try:
        say(f"raw IDLE notification latency ({min(mails, 50)} samples)…")
        raw_user = info.add_user(f"bench-raw-{run}@example.com", "pw")
        raw = raw_idle_latency(info, raw_user.username, raw_user.password, min(mails, 50))
        recorder = ReplyRecorder().start()
        config = _config(info, run, user.username, user.password, folder, recorder.port)
        cfg = load_config(config)
        ensure_topics(cfg.kafka, ["5s"])
        watcher = recorder
        latencies: list[float] = []
        lost = 0
        with (
            Pipeline(config, folder / "logs") as pipeline,
            IMAPClient(info.imap.host, info.imap.port, ssl=False, timeout=30) as client,
        ):
            client.login(user.username, user.password)
            # Warm-up: the first reply waits for the worker's group join and changelog set-up.
            mid, raw_mail = _request(run, -1)
            client.append("INBOX", raw_mail)
            deadline = time.perf_counter() + 120
            while mid not in watcher.arrived and time.perf_counter() < deadline:
                pipeline.check_alive()
                time.sleep(0.1)
            if mid not in watcher.arrived:
                raise click.ClickException(
                    f"the pipeline did not answer the warm-up mail within 120 s; "
                    f"logs in {folder / 'logs'}"
                )
            say(f"pipeline warm; measuring {mails} mails one at a time…")
            for n in range(mails):
                mid, raw_mail = _request(run, n)
                start = time.perf_counter()
                client.append("INBOX", raw_mail)
                while mid not in watcher.arrived and time.perf_counter() - start < REPLY_TIMEOUT_S:
                    time.sleep(0.002)
                if mid in watcher.arrived:
                    latencies.append(watcher.arrived[mid] - start)
                else:
                    lost += 1
                    pipeline.check_alive()
        watcher.stop()
    finally:
        if started:
            dev_down(None)
    figures = {
        "mails": mails,
        "replies": len(latencies),
        "timed_out": lost,
        "e2e_p50_s": round(_percentile(latencies, 50), 4) if latencies else None,
        "e2e_p99_s": round(_percentile(latencies, 99), 4) if latencies else None,
        "e2e_max_s": round(max(latencies), 4) if latencies else None,
        "raw_idle_p50_s": round(statistics.median(raw), 4) if raw else None,
        "raw_idle_p99_s": round(_percentile(raw, 99), 4) if raw else None,
        "target_p99_s": 1.0,
    }
    if not json_out:
        click.echo(
            f"APPEND → reply received: p50 {figures['e2e_p50_s']} s, p99 {figures['e2e_p99_s']} s "
            f"over {len(latencies)} mails ({lost} timed out)\n"
            f"raw IDLE notification:   p50 {figures['raw_idle_p50_s']} s, p99 {figures['raw_idle_p99_s']} s\n"
            f"target: p99 under 1 s"
        )
    return figures
