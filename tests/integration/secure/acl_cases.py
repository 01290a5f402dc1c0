"""Runs a component as a process against the secured broker with all but one of its ACLs.

Each run has its own names (topics, groups, app id, account: a ``unique`` suffix) and its own
principal: an mTLS client certificate whose CN is ``<component principal>-<n>``, issued by the
dev CA (the broker maps the CN to the principal). So the runs of one component are independent
and several run at once (`PARALLEL`): the ACLs of one principal never help another.

A run is one start: the component's config written with the principal's mTLS settings, the
computed ACLs (`mailtap.acls.component_acls`) granted except ``missing``, ``mailtap run
COMPONENT`` started, and then watched until it exits, or until its ``/healthz`` says why it is
unhealthy, or `STOP_WITHIN_S` (plus a hang guard) passes. What it wrote is read afterwards
through the admin listener.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.core.config import KafkaSettings, MailtapConfig, TopicNames, config_from_dict
from connectors.core.kafka.acls import Acl
from connectors.core.kafka.clients import consumer_config
from connectors.core.kafka.retry import retry_retriable
from mailtap.acls import component_acls
from mailtap.dev.certs import CertificateAuthority
from mailtap.dev.secure import SecureKafka
from mailtap.dev.secure_acls import bindings
from tests.integration.secure.conftest import grant, revoke

REPO = Path(__file__).resolve().parents[3]
#: The brief's bound for the line (a requirement, not a speed target).
STOP_WITHIN_S = 30.0
#: A loaded machine starts Python slowly: the hang guard past the bound (the bound is asserted).
HANG_GUARD_S = 60.0
#: After the line, how long a component that stops may take to exit (its Kafka clients close
#: their TLS connections; slower on a loaded machine). One that keeps running is watched as
#: long for a repeat of the line.
EXIT_WATCH_S = 15.0
#: Runs at once (each is mostly waiting on the broker and on Python's start).
PARALLEL = 3
#: Stands for a run's unique suffix in the case ids (the names are computed at collection).
PLACEHOLDER = "U0U0U0"


def topic_names(unique: str) -> dict[str, str]:
    return {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}


def kafka_section(bootstrap: str, unique: str) -> dict[str, Any]:
    return {"bootstrap_servers": bootstrap, "partitions": 1, "topics": topic_names(unique)}


@dataclass
class Subject:
    """One component under test.

    ``config(unique, run_dir)``: its whole config on the admin listener; ``prepare(cfg, run_dir)``:
    the topics (the admin's `topics ensure`) and its input, through the admin listener;
    ``outputs(cfg, run_dir)``: what it wrote or sent (every count 0 when it must not have run).
    """

    component: str
    principal: str
    config: Callable[[str, Path], dict[str, Any]]
    prepare: Callable[[MailtapConfig, Path], None]
    outputs: Callable[[MailtapConfig, Path], dict[str, int]]

    def acls(self, unique: str = PLACEHOLDER) -> list[Acl]:
        raw = self.config(unique, Path("/nonexistent"))
        return component_acls(config_from_dict(raw, env={}), self.component)

    def case_ids(self) -> list[str]:
        return [case_id(acl) for acl in self.acls()]


def case_id(acl: Acl, unique: str = PLACEHOLDER) -> str:
    return str(acl).replace(unique, "U").replace(" ", "-")


@dataclass
class Run:
    case: str
    missing: Acl | None
    principal: str
    text: str = ""
    returncode: int | None = None
    took: float = 0.0
    health: tuple[int, dict[str, Any]] | None = None
    outputs: dict[str, int] = field(default_factory=dict)
    denials: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        """What the sentence must say (operation and resource)."""
        assert self.missing is not None
        return f"may not {self.missing.operation.upper()} {self.missing.resource_type} {self.missing.name}"

    def lines_with(self, text: str) -> list[str]:
        return [line for line in self.text.splitlines() if text in line]


class Runner:
    """Runs the cases of one subject, `PARALLEL` at once."""

    def __init__(
        self, subject: Subject, secure_kafka: SecureKafka, admin: AdminClient, folder: Path
    ) -> None:
        self.subject = subject
        self.secure_kafka = secure_kafka
        self.admin = admin
        self.folder = folder
        self.ca = CertificateAuthority(Path(secure_kafka.ca_location).parent)

    def run_all(self, cases: list[str]) -> dict[str, Run]:
        with ThreadPoolExecutor(PARALLEL) as pool:
            futures = {c: pool.submit(self.run, c, n) for n, c in enumerate(cases)}
            return {c: f.result() for c, f in futures.items()}

    def run(self, case: str, n: int) -> Run:
        unique = f"{os.urandom(4).hex()}{n}"
        run_dir = self.folder / f"{self.subject.component}-{n}"
        run_dir.mkdir(parents=True)
        raw = self.subject.config(unique, run_dir)
        admin_cfg = config_from_dict(raw, env={})
        self.subject.prepare(admin_cfg, run_dir)
        principal = f"{self.subject.principal}-{n}"
        pair = self.ca.issue(run_dir / "client", principal)
        raw["kafka"] = {
            **raw["kafka"],
            "bootstrap_servers": self.secure_kafka.mtls_bootstrap,
            "security_protocol": "SSL",
            "ssl_ca_location": self.secure_kafka.ca_location,
            "ssl_certificate_location": str(pair.certificate),
            "ssl_key_location": str(pair.key),
        }
        needed = component_acls(config_from_dict(raw, env={}), self.subject.component)
        missing = None
        if case != "all":
            found = [a for a in needed if case_id(a, unique) == case]
            assert len(found) == 1, f"{case} is not among the computed ACLs: {needed}"
            missing = found[0]
        granted = bindings(principal, [a for a in needed if a != missing])
        result = Run(case, missing, principal)
        config = run_dir / "config.yaml"
        config.write_text(yaml.safe_dump(raw))
        log = run_dir / "component.log"
        authorizer = Path(self.secure_kafka.authorizer_log)
        grant(self.admin, granted)
        try:
            since = authorizer.stat().st_size if authorizer.exists() else 0
            env = {**os.environ, "PYTHONPATH": str(REPO), "MAILTAP_LOG_LEVEL": "INFO"}
            command = ["mailtap.cli", "run", self.subject.component, "-c", str(config)]
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", *command],
                    env=env,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                if missing is None:
                    self._watch_working(proc, log, admin_cfg, run_dir, result)
                else:
                    self._watch_refused(proc, log, result)
            finally:
                _stop(proc)
            result.text = log.read_text(errors="replace")
            result.outputs = self.subject.outputs(admin_cfg, run_dir)
            result.denials = _denials(authorizer, principal, since)
        finally:
            revoke(self.admin, granted)
        return result

    def _watch_refused(self, proc: subprocess.Popen[bytes], log: Path, run: Run) -> None:
        """Until the line (then until the exit, or, still running, its /healthz), the exit, or
        the hang guard. ``run.took`` counts from the component's first log line: the
        interpreter's start and the imports (up to ~30 s on a loaded 2-core machine) are not
        what the bound is about."""
        start = time.monotonic()
        first_output: float | None = None
        while time.monotonic() - start < STOP_WITHIN_S + HANG_GUARD_S:
            text = log.read_text(errors="replace")
            if text and first_output is None:
                first_output = time.monotonic()
            if run.line in text or proc.poll() is not None:
                run.took = time.monotonic() - (first_output or start)
                break
            time.sleep(0.2)
        else:
            run.took = time.monotonic() - (first_output or start)
        try:
            run.returncode = proc.wait(EXIT_WATCH_S)
        except subprocess.TimeoutExpired:
            run.health = _healthz(log.read_text(errors="replace"))

    def _watch_working(
        self,
        proc: subprocess.Popen[bytes],
        log: Path,
        admin_cfg: MailtapConfig,
        run_dir: Path,
        run: Run,
    ) -> None:
        start = time.monotonic()
        while time.monotonic() - start < 3 * STOP_WITHIN_S + HANG_GUARD_S:
            if proc.poll() is not None:
                run.returncode = proc.returncode
                break
            if all(self.subject.outputs(admin_cfg, run_dir).values()):
                break
            time.sleep(0.5)
        run.took = time.monotonic() - start


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _healthz(log_text: str) -> tuple[int, dict[str, Any]] | None:
    port = re.search(r"health endpoint on http://127.0.0.1:(\d+)/healthz", log_text)
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def _denials(log: Path, principal: str, since: int) -> list[str]:
    if not log.exists():
        return []
    with open(log, errors="replace") as lines:
        lines.seek(since)
        return [line for line in lines if f"User:{principal} is Denied" in line]


def records_on(kafka: KafkaSettings, topics: list[str]) -> int:
    """Offsets taken on ``topics`` (records and transaction markers): 0 when nothing was
    written, not even an aborted transaction."""
    consumer = Consumer(consumer_config(kafka, f"acl-cases-{os.urandom(4).hex()}"))
    try:
        total = 0
        metadata = consumer.list_topics(timeout=30).topics
        for topic in topics:
            for partition in metadata[topic].partitions if topic in metadata else {}:
                # A topic created a moment ago may have no leader yet (NOT_LEADER_FOR_PARTITION).
                tp = TopicPartition(topic, partition)
                low, high = retry_retriable(
                    lambda tp=tp: consumer.get_watermark_offsets(tp, timeout=30, cached=False),
                    time.monotonic() + 60,
                    f"the offsets of {topic}/{partition}",
                )
                total += high - low
        return total
    finally:
        consumer.close()
