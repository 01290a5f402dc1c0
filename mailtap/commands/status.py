"""``mailtap status -c CONFIG [--json]``: where every mailbox and topic stands, read from Kafka.

Everything comes from the cluster (and from the health endpoints given), so it works from any
machine that reaches Kafka, whether or not a component runs there:

* per mailbox: its cursor on the offsets topic and when it was written, the last event of the
  window and how many (by ``observed_at``; ``events_per_hour``: per hour of the window, by
  record time), and its records on the DLQ (source DLQ headers;
  records dropped with ``mailtap dlq drop`` do not count);
* per topic: the lag of the streams app's group and of the SMTP sink's group (``-``: that
  partition has no committed offset yet);
* delivery outcomes of the window by status (``mail.delivery``) and the bounce rate, i.e.
  BOUNCED / (SENT + BOUNCED): of the mail a relay accepted, the share that came back;
* each ``/healthz`` answer (the config's ``health`` section, and ``--health URL``);
* per mailbox the configuration's sources want (``mailtap mailboxes list``): the group member that
  owns it now, from the group coordinator (``describe_owners``), and, when one of the ``/healthz``
  answers asked lists it, its worker state and the age of its last sync. Without such an answer
  the age is that of its cursor record on the offsets topic (``age_of``: ``cursor``), i.e. of
  the last batch it committed: an idle mailbox writes no cursor, so that age grows while it is
  healthy; ask each instance's ``/healthz`` (``--health URL``) for the sync age itself.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable
from typing import Any

import click

from connectors.core.avro.serde import AnyAvroDecoder
from connectors.core.config import MailtapConfig, load_config
from connectors.core.errors import DataError
from mailtap.commands.common import config_option
from mailtap.commands.dlq import read_dropped
from mailtap.commands.mailboxes import SOURCES, mailbox_listing
from mailtap.commands.topicscan import group_lag, scan
from mailtap.deployment_names import lag_groups

#: Header names of the source DLQ records (connectors.core.source.records.RecordBuilder.dlq).
SOURCE_KIND, SOURCE_ACCOUNT, SOURCE_FOLDER = (
    "mailtap.source.kind",
    "mailtap.source.account",
    "mailtap.source.folder",
)


def _iso(ms: int | float | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def mailbox_id(kind: str, account: str, folder: str) -> str:
    return f"{kind.lower()}/{account}/{folder}"


def collect(
    cfg: MailtapConfig, *, window_s: float = 3600.0, health_urls: tuple[str, ...] = ()
) -> dict[str, Any]:
    kafka, topics = cfg.kafka, cfg.kafka.topics
    decoder = AnyAvroDecoder(kafka.schema_registry_url, kafka.schema_registry)
    now_ms = int(time.time() * 1000)
    since_ms = now_ms - int(window_s * 1000)
    mailboxes: dict[str, dict[str, Any]] = {}
    hours = max(1, math.ceil(window_s / 3600))

    def hour_of(stamp_ms: float) -> int:
        """Index of the hour bucket of the window (0 = the oldest), clamped into the window."""
        return min(hours - 1, max(0, hours - 1 - int((now_ms - stamp_ms) // 3_600_000)))

    def box(name: str) -> dict[str, Any]:
        return mailboxes.setdefault(
            name,
            {
                "cursor": None,
                "cursor_written_at": None,
                "last_event_at": None,
                "events_in_window": 0,
                "events_per_hour": [0] * hours,
                "dlq_records": 0,
                "owner": None,
                "state": None,
                "last_sync_age_seconds": None,
                "age_of": None,
            },
        )

    for seen in scan(kafka, topics.offsets):
        if seen.key is None:
            continue
        part = json.loads(seen.key)
        name = mailbox_id(
            part.get("source", "?"), part.get("account", "?"), part.get("folder", "?")
        )
        if seen.value is None:
            mailboxes.pop(name, None)
            continue
        entry = box(name)
        entry["cursor"] = json.loads(seen.value)
        entry["cursor_written_at"] = _iso(seen.timestamp_ms)

    undecodable = 0
    for seen in scan(kafka, topics.events, since_ms=since_ms):
        if seen.value is None:
            continue
        try:
            _, event = decoder.decode(seen.value, topics.events)
        except DataError:
            undecodable += 1
            continue
        source = event.get("source") or {}
        entry = box(
            mailbox_id(str(source.get("kind", "?")), event["account"], source.get("folder", "?"))
        )
        entry["events_in_window"] += 1
        entry["events_per_hour"][hour_of(seen.timestamp_ms)] += 1
        observed = event.get("observed_at")
        if isinstance(observed, dt.datetime):
            stamp = observed.isoformat(timespec="seconds")
            entry["last_event_at"] = max(entry["last_event_at"] or "", stamp)

    commands_dlq = 0
    dropped = read_dropped(kafka, topics.dlq)  # handled with `mailtap dlq drop`
    for seen in scan(kafka, topics.dlq):
        if f"{seen.partition}:{seen.offset}" in dropped:
            continue
        account = seen.header(SOURCE_ACCOUNT)
        if account is None:
            commands_dlq += 1
            continue
        kind, folder = seen.header(SOURCE_KIND) or "?", seen.header(SOURCE_FOLDER) or "?"
        box(mailbox_id(kind, account, folder))["dlq_records"] += 1

    deliveries: Counter[str] = Counter()
    deliveries_per_hour: dict[str, list[int]] = {}
    for seen in scan(kafka, topics.delivery, since_ms=since_ms):
        if seen.value is None:
            continue
        try:
            _, event = decoder.decode(seen.value, topics.delivery)
        except DataError:
            deliveries["undecodable"] += 1
            continue
        deliveries[str(event["status"])] += 1
        per_hour = deliveries_per_hour.setdefault(str(event["status"]), [0] * hours)
        per_hour[hour_of(seen.timestamp_ms)] += 1
    accepted = deliveries["SENT"] + deliveries["BOUNCED"]
    health = {url: _health(url) for url in _health_urls(cfg, health_urls)}
    rows = mailbox_listing(cfg) if any(k in SOURCES for k in cfg.model_extra or {}) else []
    for row in rows:
        entry = box(row["mailbox"])
        entry.update(ownership(row, health.values(), entry["cursor_written_at"], now_ms))
    return {
        "at": _iso(now_ms),
        "window_seconds": window_s,
        "mailboxes": dict(sorted(mailboxes.items())),
        "undecodable_events_in_window": undecodable,
        "commands_dlq_records": commands_dlq,
        "lag": _lags(cfg),
        "deliveries_in_window": dict(sorted(deliveries.items())),
        # Per status, one count per hour of the window, the oldest first (the console's chart).
        "deliveries_per_hour": dict(sorted(deliveries_per_hour.items())),
        "bounce_rate": round(deliveries["BOUNCED"] / accepted, 4) if accepted else None,
        "health": health,
    }


#: ``owner`` of a wanted mailbox of a source without a group: every instance of this
#: configuration runs it (there is no coordinator to ask which one is up).
NO_GROUP = "this config runs it (no group)"


def ownership(
    row: dict[str, Any],
    answers: Iterable[dict[str, Any]],
    cursor_written_at: str | None,
    now_ms: int,
) -> dict[str, Any]:
    """Owner, state and last-sync age of one ``mailbox_listing`` row. The first ``/healthz``
    answer listing the mailbox gives the state and the sync age; otherwise the age is that of
    the cursor record (the last committed batch) and the state is unknown (None)."""
    if row["origin"] == "removed":
        owner = None
    elif row["group"] is None:
        owner = NO_GROUP
    else:
        owner = row["owner"]  # None: no live member holds it (rebalancing, or none running)
    found: dict[str, Any] = {"origin": row["origin"], "group": row["group"], "owner": owner}
    for answer in answers:
        ages = answer.get("ages") or {}
        if row["mailbox"] in ages:
            state = (answer.get("states") or {}).get(row["mailbox"])
            return {
                **found,
                "state": state,
                # What the mailbox's server lacks and the source does instead (e.g. polling).
                "fallbacks": (answer.get("fallbacks") or {}).get(row["mailbox"], []),
                "last_sync_age_seconds": ages[row["mailbox"]],
                "age_of": "healthz",
            }
    if cursor_written_at is None:
        return {**found, "state": None, "last_sync_age_seconds": None, "age_of": None}
    written = dt.datetime.fromisoformat(cursor_written_at).timestamp() * 1000
    age = round(max(0.0, (now_ms - written) / 1000), 1)
    return {**found, "state": None, "last_sync_age_seconds": age, "age_of": "cursor"}


def _lags(cfg: MailtapConfig) -> dict[str, Any]:
    return {group: group_lag(cfg.kafka, group, names) for group, names in lag_groups(cfg).items()}


def _health_urls(cfg: MailtapConfig, extra: tuple[str, ...]) -> list[str]:
    urls = list(extra)
    if "health" in cfg.model_fields_set and cfg.health.port:
        host = "127.0.0.1" if cfg.health.host in ("0.0.0.0", "::") else cfg.health.host
        urls.append(f"http://{host}:{cfg.health.port}/healthz")
    return urls


def _health(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return {"status": response.status, **json.loads(response.read())}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, **json.loads(exc.read() or b"{}")}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"status": None, "ok": False, "reason": f"unreachable: {exc}"}


def render(report: dict[str, Any]) -> str:
    lines = [f"mailtap status at {report['at']} (window {report['window_seconds']:.0f}s)", ""]
    lines.append("MAILBOX  CURSOR_WRITTEN  LAST_EVENT  EVENTS  DLQ  CURSOR")
    for name, box in report["mailboxes"].items():
        lines.append(
            f"{name}  {box['cursor_written_at'] or '-'}  {box['last_event_at'] or '-'}  "
            f"{box['events_in_window']}  {box['dlq_records']}  {json.dumps(box['cursor'])}"
        )
    lines += ["", "MAILBOX  OWNER  STATE  LAST_SYNC_AGE"]
    for name, box in report["mailboxes"].items():
        if box.get("origin") is None:
            continue  # seen on a topic only: not a mailbox of this configuration
        owner = box["owner"] or ("— (removed)" if box["origin"] == "removed" else "—")
        age = box["last_sync_age_seconds"]
        shown = "-" if age is None else f"{age:.0f}s ({box['age_of']})"
        lines.append(f"{name}  {owner}  {box['state'] or '-'}  {shown}")
        lines += [f"  server: {note}" for note in box.get("fallbacks") or []]
    lines += ["", f"commands DLQ records: {report['commands_dlq_records']}", "", "LAG"]
    for group, per_topic in report["lag"].items():
        for topic, parts in per_topic.items():
            shown = " ".join(f"p{p}={'-' if lag is None else lag}" for p, lag in parts.items())
            shown = shown or "(no such topic)"
            lines.append(f"{group}  {topic}  {shown}")
    deliveries = " ".join(f"{k}={v}" for k, v in report["deliveries_in_window"].items()) or "none"
    rate = report["bounce_rate"]
    lines += ["", f"deliveries: {deliveries}", f"bounce rate: {'-' if rate is None else rate}"]
    for url, answer in report["health"].items():
        verdict = "ok" if answer.get("ok") else f"UNHEALTHY: {answer.get('reason', answer)}"
        lines.append(f"health {url}: {verdict}")
    return "\n".join(lines)


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the text.")
@click.option("--window", default=3600.0, show_default=True, help="Seconds counted as recent.")
@click.option("--health", "health_urls", multiple=True, help="A /healthz URL to ask as well.")
def status(config_path: str, as_json: bool, window: float, health_urls: tuple[str, ...]) -> None:
    """Mailboxes, lag, deliveries and health, read from Kafka."""
    report = collect(load_config(config_path), window_s=window, health_urls=health_urls)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
