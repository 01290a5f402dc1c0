"""Least privilege, run (issue 27 items 3 and 4): each component with exactly the ACLs
`mailtap acls` computes for its config works, and without any one of them it stops (or stays
unhealthy, its ``/healthz`` saying why) with one line naming the operation, the resource and
the kafka-acls command that grants it, before it sends or writes anything.

Every ACL of every component is left out in turn (the case ids are the computed ACLs, with
``U`` for the run's unique suffix). The runs of a component go `acl_cases.PARALLEL` at once
against the session's secured broker, each with its own names and its own principal (an mTLS
certificate): see `tests.integration.secure.acl_cases`.

- the IMAP and EWS sources: no event written, no cursor (both topics stay empty, not even an
  aborted transaction); a refused transactional id is per mailbox: the source keeps running,
  that mailbox backs off at its cap, ``/healthz`` answers 503 with the sentence.
- the streams worker: nothing on ``mail.commands`` or ``mail.workflow``.
- the SMTP sink: nothing sent, no delivery event (it checks Write on ``mail.delivery`` and its
  transactional id before its first send). Without Read on ``mail.suppressions`` it does not
  run: before, it ran "healthy" and sent to suppressed recipients.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from imapclient import IMAPClient

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import MailtapConfig
from connectors.core.kafka.clients import producer_config
from connectors.core.kafka.topics import ensure_topic_specs, ensure_topics
from connectors.imap.indexlog import topic_spec as index_topic_spec
from connectors.smtp.state import ensure_state_topic
from mailtap.dev import DevServices
from mailtap.dev.secure import SecureKafka
from streams.testing import mail_record
from tests.ews_server import EwsTestServer
from tests.ews_server.fixture import PASSWORD, USER, fast_server
from tests.integration.imap.imap_harness import make_mail
from tests.integration.secure.acl_cases import (
    STOP_WITHIN_S,
    Run,
    Runner,
    Subject,
    kafka_section,
    records_on,
)
from tests.integration.smtp.smtp_harness import command, produce_commands
from tests.integration.smtp.smtp_scripted_server import ScriptedRelay

#: Endpoints for computing the case ids at collection (the names do not depend on them).
_NOWHERE = "127.0.0.1:9"
_ADDING_USERS = threading.Lock()
#: The first test of a component runs all its cases in its setup (`acl_cases.PARALLEL` at once):
#: far more than the suite's per-test timeout on a loaded machine.
RUNS_TIMEOUT_S = 1800


def _unique(cfg: MailtapConfig) -> str:
    return cfg.kafka.topics.events.rsplit(".", 1)[1]


# --- the subjects --------------------------------------------------------------------------


def sink_subject(bootstrap: str, relay: ScriptedRelay | None) -> Subject:
    def config(unique: str, run_dir: Path) -> dict[str, Any]:
        return {
            "kafka": kafka_section(bootstrap, unique),
            "health": {"port": 0},
            "smtp": {
                "host": "127.0.0.1",
                "port": relay.port if relay is not None else 25,
                "security": "plain",
                "from_address": "mailtap@example.com",
                "group_id": f"sink-{unique}",
                "state_topic": f"mailtap.sink.state.{unique}",
                "instance_id": f"test-{unique}",
                "retry_tiers": ["1s"],
            },
        }

    def prepare(cfg: MailtapConfig, run_dir: Path) -> None:
        unique = _unique(cfg)
        produce_commands(cfg, [command([f"r-{unique}@example.org"], command_id=f"c-{unique}")])
        ensure_state_topic(cfg.kafka, f"mailtap.sink.state.{unique}", 1)

    def outputs(cfg: MailtapConfig, run_dir: Path) -> dict[str, int]:
        assert relay is not None
        rcpt = f"r-{_unique(cfg)}@example.org"
        sent = [m for m in relay.handler.snapshot() if rcpt in m.rcpt_tos]
        return {"sent": len(sent), "delivery": records_on(cfg.kafka, [cfg.kafka.topics.delivery])}

    return Subject("smtp-sink", "mailtap-smtp-sink", config, prepare, outputs)


def imap_subject(bootstrap: str, services: DevServices | None) -> Subject:
    def config(unique: str, run_dir: Path) -> dict[str, Any]:
        return {
            "kafka": kafka_section(bootstrap, unique),
            "claim_check": {"url": (run_dir / "claims").as_uri()},
            "health": {"port": 0, "max_sync_age_seconds": 600},
            "imap": {
                "accounts": [
                    {
                        "name": f"acct-{unique}",
                        "host": services.imap.host if services else "127.0.0.1",
                        "port": services.imap.port if services else 143,
                        "security": "plain",
                        "username": f"acl-{unique}@example.com",
                        "password": f"pw-{unique}",
                        "folders": ["INBOX"],
                        "start": "all",
                    }
                ],
                "connect_timeout_seconds": 5,
                "read_timeout_seconds": 10,
                # A refused mailbox retries at the cap: no second line while it is watched.
                "backoff_initial_seconds": 30,
                "backoff_cap_seconds": 60,
            },
        }

    def prepare(cfg: MailtapConfig, run_dir: Path) -> None:
        assert services is not None
        unique = _unique(cfg)
        with _ADDING_USERS:  # add_user rewrites Dovecot's passwd file: one at a time
            user = services.add_user(f"acl-{unique}@example.com", f"pw-{unique}")
        ensure_topics(cfg.kafka, retry_tiers=[])
        ensure_topic_specs(cfg.kafka, [index_topic_spec(cfg.kafka)])
        with IMAPClient(services.imap.host, services.imap.port, ssl=False, timeout=30) as client:
            client.login(user.username, user.password)
            client.append("INBOX", make_mail(f"m-{unique}@example.com", "acl case"))

    def outputs(cfg: MailtapConfig, run_dir: Path) -> dict[str, int]:
        t = cfg.kafka.topics
        return {
            "events": records_on(cfg.kafka, [t.events]),
            "cursor": records_on(cfg.kafka, [t.offsets]),
        }

    return Subject("imap-source", "mailtap-imap-source", config, prepare, outputs)


def ews_subject(bootstrap: str, ews: EwsTestServer | None) -> Subject:
    def config(unique: str, run_dir: Path) -> dict[str, Any]:
        return {
            "kafka": kafka_section(bootstrap, unique),
            "claim_check": {"url": (run_dir / "claims").as_uri()},
            "health": {"port": 0, "max_sync_age_seconds": 600},
            "ews": {
                "accounts": [
                    {
                        "name": f"ex-{unique}",
                        "service_endpoint": ews.url if ews else "http://127.0.0.1:9/EWS",
                        "email": USER,
                        "auth": "basic",
                        "password": PASSWORD,
                        "start": "all",
                    }
                ],
                "connection_timeout_minutes": 1,
                "stream_read_timeout_seconds": 5,
                "backoff_initial_seconds": 30,
                "backoff_cap_seconds": 60,
            },
        }

    def prepare(cfg: MailtapConfig, run_dir: Path) -> None:
        ensure_topics(cfg.kafka, retry_tiers=[])

    def outputs(cfg: MailtapConfig, run_dir: Path) -> dict[str, int]:
        t = cfg.kafka.topics
        return {
            "events": records_on(cfg.kafka, [t.events]),
            "cursor": records_on(cfg.kafka, [t.offsets]),
        }

    return Subject("ews-source", "mailtap-ews-source", config, prepare, outputs)


def streams_subject(bootstrap: str) -> Subject:
    def config(unique: str, run_dir: Path) -> dict[str, Any]:
        return {
            "kafka": kafka_section(bootstrap, unique),
            "claim_check": {"url": (run_dir / "claims").as_uri()},
            "streams": {
                "app_id": f"mailtap-streams-{unique}",
                "data_dir": str(run_dir / "faust"),
                "from_address": {"name": "Helpdesk", "address": "help@example.com"},
                "auth_policy": "none",
                "rules": [
                    {"match": {"recipient": "support@example.com"}, "workflow": "ticket_intake"}
                ],
            },
        }

    def prepare(cfg: MailtapConfig, run_dir: Path) -> None:
        ensure_topics(cfg.kafka, retry_tiers=[])
        # Dated now: older mail is not answered (streams.max_reply_age).
        record = mail_record(
            message_id=f"m-{_unique(cfg)}@example.com",
            observed_at=dt.datetime.now(dt.UTC),
            to=("support@example.com",),
        )
        serde = AvroSerde.for_schema("MailEvent", cfg.kafka)
        producer = Producer(producer_config(cfg.kafka))
        topic = cfg.kafka.topics.events
        producer.produce(topic, key=record["key"], value=serde.encode(record, topic))
        assert producer.flush(30) == 0

    def outputs(cfg: MailtapConfig, run_dir: Path) -> dict[str, int]:
        t = cfg.kafka.topics
        return {"written": records_on(cfg.kafka, [t.commands, t.workflow])}

    return Subject("streams", "mailtap-streams", config, prepare, outputs)


SINK_CASES = sink_subject(_NOWHERE, None).case_ids()
IMAP_CASES = imap_subject(_NOWHERE, None).case_ids()
EWS_CASES = ews_subject(_NOWHERE, None).case_ids()
STREAMS_CASES = streams_subject(_NOWHERE).case_ids()


# --- the runs (all cases of a component at once) ------------------------------------------


def _selected(request: pytest.FixtureRequest, test_name: str) -> list[str]:
    """The cases of ``test_name`` this session runs (``-k`` honoured)."""
    return [
        item.callspec.params["case"]  # type: ignore[attr-defined]
        for item in request.session.items
        if getattr(item, "originalname", None) == test_name
    ]


def _runs(
    request: pytest.FixtureRequest,
    subject: Subject,
    secure_kafka: SecureKafka,
    admin: AdminClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Run]:
    cases = _selected(request, f"test_{subject.component.replace('-', '_')}_without_one_acl")
    cases += ["all"]
    folder = tmp_path_factory.mktemp(subject.component)
    return Runner(subject, secure_kafka, admin, folder).run_all(cases)


@pytest.fixture(scope="module")
def relay() -> Iterator[ScriptedRelay]:
    with ScriptedRelay() as server:
        yield server


@pytest.fixture(scope="module")
def ews_server() -> Iterator[EwsTestServer]:
    with fast_server() as server:
        server.deliver(
            USER,
            b"From: Shop <orders@shop.example>\r\nTo: user@example.com\r\nSubject: Order 1\r\n"
            b"Message-ID: <order-1@shop.example>\r\nDate: Sun, 29 Nov 2026 16:00:00 +0000\r\n"
            b"MIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\nOrder 1\r\n",
        )
        yield server


@pytest.fixture(scope="module")
def sink_runs(request, secure_kafka, admin, relay, tmp_path_factory) -> dict[str, Run]:  # type: ignore[no-untyped-def]
    subject = sink_subject(secure_kafka.admin_bootstrap, relay)
    return _runs(request, subject, secure_kafka, admin, tmp_path_factory)


@pytest.fixture(scope="module")
def imap_runs(request, secure_kafka, admin, services, tmp_path_factory) -> dict[str, Run]:  # type: ignore[no-untyped-def]
    subject = imap_subject(secure_kafka.admin_bootstrap, services)
    return _runs(request, subject, secure_kafka, admin, tmp_path_factory)


@pytest.fixture(scope="module")
def ews_runs(request, secure_kafka, admin, ews_server, tmp_path_factory) -> dict[str, Run]:  # type: ignore[no-untyped-def]
    subject = ews_subject(secure_kafka.admin_bootstrap, ews_server)
    return _runs(request, subject, secure_kafka, admin, tmp_path_factory)


@pytest.fixture(scope="module")
def streams_runs(request, secure_kafka, admin, tmp_path_factory) -> dict[str, Run]:  # type: ignore[no-untyped-def]
    subject = streams_subject(secure_kafka.admin_bootstrap)
    return _runs(request, subject, secure_kafka, admin, tmp_path_factory)


# --- what must hold -----------------------------------------------------------------------


def _works(run: Run) -> None:
    """With exactly the computed ACLs: it did its job, nothing was denied on the way."""
    assert run.returncode is None or run.returncode == 0, run.text
    assert all(run.outputs.values()), (run.outputs, run.text)
    assert "may not" not in run.text and "Traceback" not in run.text, run.text
    assert run.denials == [], run.denials


def _refused(run: Run, *, may_back_off: bool = False) -> None:
    """Without ``run.missing``: one line within the bound, nothing done."""
    assert run.missing is not None
    text = run.text
    assert run.took < STOP_WITHIN_S, f"{run.took:.0f}s:\n{text}"
    assert "Traceback" not in text, text
    assert all(count == 0 for count in run.outputs.values()), (run.outputs, text)
    lines = run.lines_with(run.line)
    if run.returncode is not None:
        assert run.returncode != 0, text
        assert len(lines) == 1, text  # one line: no retry loop before the exit
    else:
        # Still running: only a mailbox's transactional id is refused per mailbox.
        assert may_back_off and run.missing.resource_type == "transactional-id", text
        assert len(lines) == 1, text  # backing off at its cap, not in a tight loop
        assert run.health is not None and run.health[0] == 503, run.health
        assert run.line in run.health[1]["reason"], run.health
    (line,) = lines
    assert f"User:{run.principal} " in line, line
    assert "kafka-acls.sh" in line and f"--operation {run.missing.operation}" in line, line
    assert f"User:{run.principal}" in line.split("grant it with:")[1], line


@pytest.mark.timeout(RUNS_TIMEOUT_S)
def test_smtp_sink_with_exactly_the_computed_acls_sends(sink_runs: dict[str, Run]) -> None:
    _works(sink_runs["all"])


@pytest.mark.timeout(RUNS_TIMEOUT_S)
@pytest.mark.parametrize("case", SINK_CASES)
def test_smtp_sink_without_one_acl(sink_runs: dict[str, Run], case: str) -> None:
    _refused(sink_runs[case])


@pytest.mark.timeout(RUNS_TIMEOUT_S)
def test_imap_source_with_exactly_the_computed_acls_publishes(imap_runs: dict[str, Run]) -> None:
    _works(imap_runs["all"])


@pytest.mark.timeout(RUNS_TIMEOUT_S)
@pytest.mark.parametrize("case", IMAP_CASES)
def test_imap_source_without_one_acl(imap_runs: dict[str, Run], case: str) -> None:
    _refused(imap_runs[case], may_back_off=True)


@pytest.mark.timeout(RUNS_TIMEOUT_S)
def test_ews_source_with_exactly_the_computed_acls_publishes(ews_runs: dict[str, Run]) -> None:
    _works(ews_runs["all"])


@pytest.mark.timeout(RUNS_TIMEOUT_S)
@pytest.mark.parametrize("case", EWS_CASES)
def test_ews_source_without_one_acl(ews_runs: dict[str, Run], case: str) -> None:
    _refused(ews_runs[case], may_back_off=True)


@pytest.mark.timeout(RUNS_TIMEOUT_S)
def test_streams_with_exactly_the_computed_acls_replies(streams_runs: dict[str, Run]) -> None:
    _works(streams_runs["all"])


@pytest.mark.timeout(RUNS_TIMEOUT_S)
@pytest.mark.parametrize("case", STREAMS_CASES)
def test_streams_without_one_acl(streams_runs: dict[str, Run], case: str) -> None:
    _refused(streams_runs[case])


def test_every_acl_of_every_component_is_a_case() -> None:
    """The cases are the computed ACLs, none left out (a new ACL is a new case)."""
    for subject, cases in (
        (sink_subject(_NOWHERE, None), SINK_CASES),
        (imap_subject(_NOWHERE, None), IMAP_CASES),
        (ews_subject(_NOWHERE, None), EWS_CASES),
        (streams_subject(_NOWHERE), STREAMS_CASES),
    ):
        assert len(cases) == len(set(cases)) == len(subject.acls()) > 5, subject.component
